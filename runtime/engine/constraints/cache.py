"""Compiled grammars: compiled off the engine loop, once per distinct constraint, kept in an LRU.

`GrammarCache.get(spec)` returns a `Future[Compiled]` at once: a hit is an already-done future,
a miss starts the compile on the cache's worker thread (XGrammar compiles in C++; the engine
loop thread never waits for it, see runtime.engine.grammar_wait). Two requests asking for the
same constraint while it compiles share one future (the second one counts as a hit). The LRU
is bounded by the compiled grammars' own size (`CompiledGrammar.memory_size_bytes`); only
finished entries are evicted. XGrammar's internal cache is off: this one is what the hit/miss
counts describe.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import xgrammar as xgr

from runtime.engine.constraints.spec import ConstraintSpec

__all__ = ["Compiled", "GrammarCache", "GrammarCacheStats"]

DEFAULT_CACHE_BYTES = 64 << 20


@dataclass(frozen=True)
class Compiled:
    grammar: xgr.CompiledGrammar
    compile_seconds: float  # the compile that made it (a hit reuses it: not counted again)
    size_bytes: int


@dataclass(frozen=True)
class GrammarCacheStats:
    num_hits: int
    num_misses: int
    num_entries: int
    size_bytes: int
    max_bytes: int
    num_evictions: int


class GrammarCache:
    def __init__(
        self,
        info: xgr.TokenizerInfo,
        *,
        max_bytes: int = DEFAULT_CACHE_BYTES,
        compile_fn: Callable[[xgr.GrammarCompiler, xgr.Grammar], xgr.CompiledGrammar] | None = None,
    ) -> None:
        """`compile_fn`: how a grammar is compiled (tests slow it down to order events)."""
        self.info = info
        self.max_bytes = max_bytes
        self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        self._compile_fn = compile_fn or (lambda compiler, g: compiler.compile_grammar(g))
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastllm-grammar")
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], Future[Compiled]] = OrderedDict()
        self._size_bytes = 0
        self.num_hits = self.num_misses = self.num_evictions = 0

    def get(
        self, spec: ConstraintSpec, grammar: xgr.Grammar | None = None
    ) -> tuple[Future[Compiled], bool]:
        """(the compiled grammar's future, whether it was a hit). `grammar`: the spec's parse,
        when the caller has it already (validation parsed it)."""
        key = spec.cache_key
        with self._lock:
            future = self._entries.get(key)
            if future is not None:
                self._entries.move_to_end(key)
                self.num_hits += 1
                return future, True
            self.num_misses += 1
            future = Future()
            self._entries[key] = future
        self._executor.submit(self._compile, key, spec, grammar, future)
        return future, False

    def _compile(
        self,
        key: tuple[str, str],
        spec: ConstraintSpec,
        grammar: xgr.Grammar | None,
        future: Future[Compiled],
    ) -> None:
        try:
            t0 = time.perf_counter()
            compiled = self._compile_fn(self._compiler, grammar or spec.to_grammar())
            result = Compiled(compiled, time.perf_counter() - t0, int(compiled.memory_size_bytes))
        except Exception as exc:  # handed to the waiting request; never cached
            with self._lock:
                self._entries.pop(key, None)
            future.set_exception(exc)
            return
        with self._lock:
            if key in self._entries:  # else: cleared meanwhile
                self._size_bytes += result.size_bytes
                self._evict()
        future.set_result(result)

    def _evict(self) -> None:
        """Least recently used finished entries out until the bound holds (under the lock)."""
        for key in list(self._entries):
            if self._size_bytes <= self.max_bytes:
                return
            future = self._entries[key]
            if future.done():
                del self._entries[key]
                self._size_bytes -= future.result().size_bytes
                self.num_evictions += 1

    def stats(self) -> GrammarCacheStats:
        with self._lock:
            return GrammarCacheStats(
                num_hits=self.num_hits,
                num_misses=self.num_misses,
                num_entries=len(self._entries),
                size_bytes=self._size_bytes,
                max_bytes=self.max_bytes,
                num_evictions=self.num_evictions,
            )

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
