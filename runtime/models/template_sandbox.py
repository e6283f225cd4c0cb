"""Rendering a checkpoint's chat template where it can be stopped: a few worker processes
(runtime/models/template_worker.py: jinja2's sandbox, a memory bound, an output bound), each
render with a time limit after which its worker is killed and replaced.

Why a process and not a thread with a watchdog: a thread cannot be stopped from outside, and a
template stuck in one C call (`'a' * 10**9`, `'x'|center(10**9)`) never returns to Python for a
trace hook to stop it; a process is killed at its deadline, and its memory bound applies to it
alone. The cost is one JSON round trip per render (a fraction of a millisecond) and, once per
worker, a start of ~0.1 s; the built-in template, which is ours, is rendered in-process.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.errors import ServiceUnavailable

WORKER_SCRIPT = Path(__file__).with_name("template_worker.py")
_START_TIMEOUT_S = 30.0  # a cold interpreter on a loaded machine; not part of a render's budget


@dataclass(frozen=True)
class TemplateLimits:
    time_s: float = 1.0  # one render (real templates take milliseconds); then it is killed
    max_output_chars: int = 4 << 20  # the rendered prompt (the request body is at most 1 MiB)
    memory_bytes: int = 512 << 20  # each worker's address space beyond its size at start
    num_workers: int = 2  # renders at once; more wait up to `time_s` for a worker


class TemplateFailure(Exception):
    """A render that failed; `kind`: "raised" (the template's raise_exception), "limit" (time,
    size or memory bound), "template" (anything else the template did)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


class _Worker:
    def __init__(self, memory_bytes: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(WORKER_SCRIPT), str(memory_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a terminal's Ctrl-C goes to the server, which ends it
        )
        self._buffer = b""
        if self._read_line(time.monotonic() + _START_TIMEOUT_S, 1 << 10) is None:
            self.kill()
            raise TemplateFailure("the template renderer did not start", "limit")

    def call(self, request: dict[str, Any], timeout_s: float, max_bytes: int) -> dict[str, Any]:
        assert self.proc.stdin is not None
        deadline = time.monotonic() + timeout_s
        try:
            self.proc.stdin.write(json.dumps(request, default=str).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise TemplateFailure("the template renderer stopped", "limit") from exc
        line = self._read_line(deadline, max_bytes)
        if line is None:
            raise TemplateFailure(f"rendering took longer than {timeout_s:g} s", "limit")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _read_line(self, deadline: float, max_bytes: int) -> bytes | None:
        """One line from the worker, or None at the deadline; a dead worker or an oversized
        line is a TemplateFailure."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return None
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise TemplateFailure("the template renderer stopped", "limit")
                self._buffer += chunk
                if len(self._buffer) > max_bytes:
                    raise TemplateFailure("the rendered output is too large", "limit")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._close_pipes()

    def stop(self) -> None:
        """An idle worker ends on its own when its stdin closes; killed if it does not."""
        self._close_pipes()
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            self.kill()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                # a broken pipe's unflushed bytes: the worker is gone anyway
                with contextlib.suppress(OSError):
                    pipe.close()


class TemplateSandbox:
    """`render(template, context)` -> text, in a worker; thread-safe."""

    def __init__(self, limits: TemplateLimits | None = None) -> None:
        self.limits = limits or TemplateLimits()
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.limits.num_workers)

    def render(self, template: str, context: dict[str, Any]) -> str:
        limits = self.limits
        if not self._slots.acquire(timeout=limits.time_s):
            raise ServiceUnavailable("every chat-template renderer is busy", retry_after_s=1.0)
        try:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            worker = worker or _Worker(limits.memory_bytes)
            request = {
                "template": template,
                "context": context,
                "max_chars": limits.max_output_chars,
            }
            max_bytes = 6 * limits.max_output_chars + (1 << 16)  # JSON escapes grow the text
            try:
                reply = worker.call(request, limits.time_s, max_bytes)
            except BaseException:
                worker.kill()  # mid-render: its state is unknown, a fresh one replaces it
                raise
            with self._lock:
                self._idle.append(worker)
        finally:
            self._slots.release()
        if "error" in reply:
            raise TemplateFailure(str(reply["error"]), str(reply.get("kind", "template")))
        return str(reply["text"])

    def close(self) -> None:
        with self._lock:
            workers, self._idle = self._idle, []
        for worker in workers:
            worker.stop()


_sandbox: TemplateSandbox | None = None
_sandbox_lock = threading.Lock()


def get_sandbox() -> TemplateSandbox:
    """The process's sandbox (workers start on first use)."""
    global _sandbox
    with _sandbox_lock:
        if _sandbox is None:
            _sandbox = TemplateSandbox()
            atexit.register(_sandbox.close)
        return _sandbox


def configure_sandbox(limits: TemplateLimits) -> None:
    """The process's sandbox from now on renders within `limits` (the server's chat_template_*
    settings); a sandbox with other limits is closed (its idle workers end)."""
    global _sandbox
    with _sandbox_lock:
        previous = _sandbox
        if previous is not None and previous.limits == limits:
            return
        _sandbox = TemplateSandbox(limits)
        atexit.register(_sandbox.close)
    if previous is not None:
        previous.close()
