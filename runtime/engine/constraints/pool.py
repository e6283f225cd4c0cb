"""Compile workers: processes that can be stopped, shared fairly between tenants.

Each of `num_workers` slots is a thread that owns one worker process (worker.py, forked from
multiprocessing's forkserver, which has XGrammar imported already, so a replacement starts in
milliseconds). The workers start at the first job or at `warm()`, not with the pool: the
forkserver's boot (a Python importing torch, transformers and XGrammar, ~2 s of CPU) is paid only
by a process that compiles, and not before a server is ready (`fastllm serve` warms its pools as
it turns ready, so its first constrained request does not wait for the boot either). A slot takes
the oldest queued job whose tenant runs fewer than `workers_per_tenant` compiles, sends it, and
watches it: past `compile_timeout_s`, past `compile_max_memory_bytes` of the worker's RSS, once no
request waits for it any more (`abandon`), or at `close`, the worker is killed (SIGKILL: a compile
in C++ hears nothing else) and replaced, and the job's future fails. So one client's hostile
constraint holds one worker for one budget at most, and never all of them.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from runtime.engine.constraints.limits import GrammarLimits
from runtime.errors import InvalidRequestError, ServiceUnavailable

__all__ = ["CompileBudgetExceeded", "CompileJob", "CompilePool", "WorkerResult"]

log = logging.getLogger(__name__)
_POLL_S = 0.05  # how often a slot looks at its worker's memory and its job's waiters
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


class CompileBudgetExceeded(InvalidRequestError):
    """The compile ran past its time or memory budget; its worker was killed."""


@dataclass(frozen=True)
class WorkerResult:
    text: str  # the compiled grammar, XGrammar's JSON serialization
    compile_seconds: float
    size_bytes: int  # heap bytes its deserialized copy holds (measured in the worker)


@dataclass(eq=False)
class CompileJob:
    kind: str
    source: str
    tenant: str
    future: Future[WorkerResult] = field(default_factory=Future)
    is_abandoned: bool = False  # no request waits for it: drop it, or kill its worker


class CompilePool:
    def __init__(
        self, info_json: str | Callable[[], str], limits: GrammarLimits, *, num_threads: int = 1
    ) -> None:
        """`info_json`: the serialized tokenizer info, or what makes it when the first worker
        starts (in a slot's thread: see GrammarCache)."""
        self.limits = limits
        self._info_json = info_json
        self._info_lock = threading.Lock()
        self._num_threads = num_threads  # XGrammar's threads inside one worker
        self._cond = threading.Condition()
        self._queue: deque[CompileJob] = deque()
        self._running: defaultdict[str, int] = defaultdict(int)  # tenant -> compiles running
        self._procs: list[BaseProcess | None] = [None] * limits.num_workers
        self._conns: dict[int, Connection] = {}
        self._closed = False
        self._is_warm = False  # a job was queued or warm() called: the slots start their workers
        self.num_killed = 0  # workers killed over a budget (time or memory)
        self._threads = [
            threading.Thread(target=self._slot, args=(i,), name=f"fastllm-grammar-{i}", daemon=True)
            for i in range(limits.num_workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, kind: str, source: str, tenant: str) -> CompileJob:
        job = CompileJob(kind, source, tenant)
        with self._cond:
            if self._closed:
                job.future.set_exception(ServiceUnavailable("the server is shutting down"))
                return job
            self._queue.append(job)
            self._is_warm = True  # every slot starts its worker, not only the one taking it
            self._cond.notify_all()
        return job

    def warm(self) -> None:
        """Start every worker now (in the slots' threads; returns at once)."""
        with self._cond:
            self._is_warm = True
            self._cond.notify_all()

    def abandon(self, job: CompileJob) -> None:
        """No request waits for `job` any more: out of the queue, or its worker killed."""
        with self._cond:
            job.is_abandoned = True
            if job in self._queue:
                self._queue.remove(job)
                job.future.set_exception(ServiceUnavailable("no request waits for the compile"))

    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._procs if p is not None and p.pid is not None]

    def close(self) -> None:
        """Kill every worker now (whatever it compiles) and fail what is queued."""
        with self._cond:
            self._closed = True
            queued, self._queue = list(self._queue), deque()
            self._cond.notify_all()
        for job in queued:
            job.future.set_exception(ServiceUnavailable("the server is shutting down"))
        for i in range(len(self._procs)):
            self._kill(i)

    # --- one slot's thread ----------------------------------------------------------------

    def _slot(self, index: int) -> None:
        with self._cond:
            while not (self._is_warm or self._closed):
                self._cond.wait()
        self._start(index)
        while True:
            job = self._next(index)
            if job is None:
                return
            try:
                self._run(index, job)
            except Exception as exc:  # a worker that could not start, or died (or was killed)
                self._kill(index)
                if not job.future.done():
                    job.future.set_exception(
                        ServiceUnavailable("the server is shutting down")
                        if self._closed
                        else InvalidRequestError(f"the grammar compile failed ({exc!r})")
                    )
            finally:
                with self._cond:
                    self._running[job.tenant] -= 1
                    self._cond.notify_all()

    def _next(self, index: int) -> CompileJob | None:
        """The oldest queued job whose tenant is within its share (None once closed)."""
        with self._cond:
            while not self._closed:
                for job in self._queue:
                    if self._running[job.tenant] < self.limits.workers_per_tenant:
                        self._queue.remove(job)
                        self._running[job.tenant] += 1
                        return job
                self._cond.wait()
        return None

    def _run(self, index: int, job: CompileJob) -> None:
        proc, conn = self._worker(index)
        conn.send(("compile", job.kind, job.source))
        deadline = time.monotonic() + self.limits.compile_timeout_s
        while not conn.poll(_POLL_S):
            why = self._why_stop(proc, job, deadline)
            if why is None:
                continue
            self._kill(index)
            if why == "abandoned" or self._closed:
                job.future.set_exception(ServiceUnavailable(f"the compile was stopped ({why})"))
            else:
                self.num_killed += 1
                job.future.set_exception(CompileBudgetExceeded(why))
            self._start(index)  # the replacement, ready for the next job
            return
        reply = conn.recv()
        if reply[0] == "ok":
            _, text, seconds, size = reply
            job.future.set_result(WorkerResult(text, float(seconds), int(size)))
        else:
            job.future.set_exception(InvalidRequestError(str(reply[1])))

    def _why_stop(self, proc: BaseProcess, job: CompileJob, deadline: float) -> str | None:
        if self._closed:
            return "shutdown"
        if job.is_abandoned:
            return "abandoned"
        limits = self.limits
        if time.monotonic() > deadline:
            return (
                f"it ran past the compile budget ({limits.compile_timeout_s:g} s, "
                "grammar_compile_timeout_s); a smaller or simpler constraint compiles within it"
            )
        rss = _rss_bytes(proc.pid)
        if rss is not None and rss > limits.compile_max_memory_bytes:
            return (
                f"its compile took more than {limits.compile_max_memory_bytes} bytes "
                "(grammar_compile_max_memory_bytes)"
            )
        if not proc.is_alive():
            return "its worker died"
        return None

    def _worker(self, index: int) -> tuple[BaseProcess, Connection]:
        proc = self._procs[index]
        if proc is not None and proc.is_alive():
            return proc, self._conns[index]
        from runtime.engine.constraints.worker import serve  # XGrammar: only once a worker starts

        info_json = self._info_json_text()
        ctx = mp.get_context("forkserver")  # a fork of a single-threaded server, XGrammar loaded
        ctx.set_forkserver_preload(["runtime.engine.constraints.worker"])
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=serve,
            args=(child, info_json, self._num_threads),
            name=f"fastllm-grammar-worker-{index}",
            daemon=True,
        )
        proc.start()
        child.close()
        self._procs[index] = proc
        self._conns[index] = parent
        if self._closed:  # close() ran while it started: it saw no process to kill
            self._kill(index)
        return proc, parent

    def _info_json_text(self) -> str:
        with self._info_lock:  # the slots start their workers together: built once
            if callable(self._info_json):
                self._info_json = self._info_json()
            return self._info_json

    def _start(self, index: int) -> None:
        if self._closed:
            return
        try:
            self._worker(index)
        except Exception as exc:  # retried when a job comes; that job fails if it fails again
            log.warning("grammar compile worker %d did not start: %s", index, exc)

    def _kill(self, index: int) -> None:
        proc = self._procs[index]
        self._procs[index] = None
        if proc is None:
            return
        proc.kill()
        proc.join(timeout=2.0)


def _rss_bytes(pid: int | None) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None
