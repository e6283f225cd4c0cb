"""Compiled grammars: compiled in worker processes (pool.py), once per distinct constraint, kept
in an LRU bounded by measured bytes.

`GrammarCache.get(spec, tenant)` returns a `Future[Compiled]` at once: a hit is an already-done
future, a miss queues the compile in the pool under the tenant's share (the engine loop thread
never waits for it, see runtime.engine.grammar_wait). Requests asking for the same constraint
while it compiles share one future (the second counts as a hit); when the last of them ends
before the compile does (`release`), the compile is dropped or its worker killed. The LRU is
bounded by the heap bytes each compiled grammar holds here, measured in the worker (worker.py);
only finished entries are evicted. Failures (a refused grammar, a budget run out) are never cached.

Counts: hit, miss, evict, timeout (a compile killed over its time or memory budget); they reach
the metrics through each request's stats (hooks.record_outcome), never from here.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runtime.engine.constraints.limits import GrammarLimits
from runtime.engine.constraints.pool import CompileJob, CompilePool, WorkerResult
from runtime.engine.constraints.spec import ConstraintSpec

if TYPE_CHECKING:  # XGrammar is imported where it is used: it pulls in transformers (~0.8 s)
    import xgrammar as xgr

__all__ = ["Compiled", "GrammarCache", "GrammarCacheStats"]

DEFAULT_CACHE_BYTES = GrammarLimits().cache_max_bytes
CompileFn = Callable[["xgr.GrammarCompiler", "xgr.Grammar"], "xgr.CompiledGrammar"]


@dataclass(frozen=True)
class Compiled:
    grammar: xgr.CompiledGrammar
    compile_seconds: float  # the compile that made it (a hit reuses it: not counted again)
    size_bytes: int  # heap bytes it holds (measured in the worker)
    num_evicted: int = 0  # entries evicted to make room for it


@dataclass(frozen=True)
class GrammarCacheStats:
    num_hits: int
    num_misses: int
    num_entries: int
    size_bytes: int
    max_bytes: int
    num_evictions: int
    num_timeouts: int = 0


@dataclass(eq=False)
class _Entry:
    future: Future[Compiled]
    job: CompileJob | None = None  # the pool's job while it compiles
    num_waiters: int = 1  # requests waiting for the compile


class GrammarCache:
    def __init__(
        self,
        info: xgr.TokenizerInfo | Callable[[], xgr.TokenizerInfo],
        *,
        max_bytes: int | None = None,
        limits: GrammarLimits | None = None,
        compile_fn: CompileFn | None = None,
    ) -> None:
        """`info`: XGrammar's view of the vocabulary, or what builds it at the first compile or
        `warm()` (the engine's load passes the builder: building imports XGrammar and
        transformers, ~0.8 s of CPU a server need not spend before it is ready).
        `compile_fn`: compile in a thread of this process with it instead of the workers
        (tests order events with it; nothing stops such a compile)."""
        self._info_lock = threading.Lock()
        self._build_info = info if callable(info) else None
        self._info = None if callable(info) else info
        self.limits = limits or GrammarLimits()
        self.max_bytes = self.limits.cache_max_bytes if max_bytes is None else max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._size_bytes = 0
        self.num_hits = self.num_misses = self.num_evictions = 0
        self._pool: CompilePool | None = None
        self._inline: tuple[ThreadPoolExecutor, xgr.GrammarCompiler, CompileFn] | None = None
        if compile_fn is None:
            self._pool = CompilePool(lambda: self.info.serialize_json(), self.limits)
        else:
            import xgrammar as xgr

            compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
            self._inline = (ThreadPoolExecutor(1, "fastllm-grammar"), compiler, compile_fn)

    @property
    def info(self) -> xgr.TokenizerInfo:
        if self._info is None:
            with self._info_lock:  # built once, by whichever slot or caller comes first
                if self._info is None:
                    assert self._build_info is not None
                    self._info = self._build_info()
        return self._info

    @property
    def pool(self) -> CompilePool | None:
        return self._pool

    def get(
        self, spec: ConstraintSpec, grammar: xgr.Grammar | None = None, tenant: str = ""
    ) -> tuple[Future[Compiled], bool]:
        """(the compiled grammar's future, whether it was a hit). `grammar`: the spec's parse,
        when the caller has it (the in-process compile_fn uses it; workers parse their own)."""
        key = spec.cache_key
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.num_hits += 1
                if not entry.future.done():
                    entry.num_waiters += 1
                return entry.future, True
            self.num_misses += 1
            entry = self._entries[key] = _Entry(Future())
        if self._pool is not None:
            job = self._pool.submit(spec.kind, spec.source, tenant)
            with self._lock:
                entry.job = job
            job.future.add_done_callback(lambda f: self._compiled(key, entry, f))
        else:
            assert self._inline is not None
            executor, compiler, compile_fn = self._inline
            executor.submit(self._compile_inline, key, entry, spec, grammar, compiler, compile_fn)
        return entry.future, False

    def release(self, spec: ConstraintSpec, future: Future[Compiled]) -> None:
        """A request waiting for `future` ended first; the last one to go stops the compile."""
        key = spec.cache_key
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.future is not future or future.done():
                return
            entry.num_waiters -= 1
            if entry.num_waiters > 0:
                return
            del self._entries[key]
            job = entry.job
        if job is not None and self._pool is not None:
            self._pool.abandon(job)

    def _compiled(self, key: tuple[str, str], entry: _Entry, done: Future[WorkerResult]) -> None:
        """On the pool's slot thread: the worker's grammar, deserialized, into the LRU."""
        import xgrammar as xgr

        try:
            result = done.result()
            grammar = xgr.CompiledGrammar.deserialize_json(result.text, self.info)
        except BaseException as exc:
            self._failed(key, entry, exc)
            return
        self._insert(key, entry, Compiled(grammar, result.compile_seconds, result.size_bytes))

    def _compile_inline(
        self,
        key: tuple[str, str],
        entry: _Entry,
        spec: ConstraintSpec,
        grammar: xgr.Grammar | None,
        compiler: xgr.GrammarCompiler,
        compile_fn: CompileFn,
    ) -> None:
        try:
            t0 = time.perf_counter()
            compiled = compile_fn(compiler, grammar or spec.to_grammar())
            seconds = time.perf_counter() - t0
        except Exception as exc:
            self._failed(key, entry, exc)
            return
        self._insert(key, entry, Compiled(compiled, seconds, int(compiled.memory_size_bytes)))

    def _failed(self, key: tuple[str, str], entry: _Entry, exc: BaseException) -> None:
        with self._lock:  # never cached: the next request compiles again
            if self._entries.get(key) is entry:
                del self._entries[key]
        if not entry.future.done():
            entry.future.set_exception(exc)

    def _insert(self, key: tuple[str, str], entry: _Entry, compiled: Compiled) -> None:
        with self._lock:
            entry.job = None
            num_evicted = 0
            if self._entries.get(key) is entry:  # else: released or cleared meanwhile
                self._size_bytes += compiled.size_bytes
                num_evicted = self._evict(key, compiled.size_bytes)
        if num_evicted:
            compiled = Compiled(
                compiled.grammar, compiled.compile_seconds, compiled.size_bytes, num_evicted
            )
        entry.future.set_result(compiled)

    def _evict(self, keep: tuple[str, str], keep_bytes: int) -> int:
        """Least recently used finished entries out until the bound holds (under the lock); the
        entry just compiled stays, so a grammar larger than the bound still serves its request."""
        num_evicted = 0
        for key in list(self._entries):
            if self._size_bytes <= self.max_bytes:
                break
            entry = self._entries[key]
            if key != keep and entry.future.done():
                del self._entries[key]
                self._size_bytes -= entry.future.result().size_bytes
                num_evicted += 1
        if self._size_bytes > self.max_bytes and keep in self._entries:
            del self._entries[keep]  # alone it is past the bound: it serves its requests only
            self._size_bytes -= keep_bytes
            num_evicted += 1
        self.num_evictions += num_evicted
        return num_evicted

    def stats(self) -> GrammarCacheStats:
        with self._lock:
            return GrammarCacheStats(
                num_hits=self.num_hits,
                num_misses=self.num_misses,
                num_entries=len(self._entries),
                size_bytes=self._size_bytes,
                max_bytes=self.max_bytes,
                num_evictions=self.num_evictions,
                num_timeouts=self._pool.num_killed if self._pool is not None else 0,
            )

    def warm(self) -> None:
        """The compile workers start now (in the background), not at the first compile."""
        if self._pool is not None:
            self._pool.warm()

    def close(self) -> None:
        """Stops every compile now (workers killed): shutdown does not wait for one."""
        if self._pool is not None:
            self._pool.close()
        if self._inline is not None:
            self._inline[0].shutdown(wait=False, cancel_futures=True)
