"""Give the process heap's free pages back to the OS now and then.

The tiers cover the memory the engine asks for by name (KV, scratch); everything else (PyTorch's
activations on CPU, Python objects, tokenizer buffers) comes from glibc malloc. Its free chunks in
the middle of the heap stay resident: `free()` only trims the top, so as request shapes vary the
heap climbs to a fragmented high-water mark and RSS stays there (the soak saw +3% over ~40k
requests, then a plateau, with the bytes actually in use flat). `malloc_trim(0)` releases every
whole free page (MADV_DONTNEED); it took 1-12 ms on a heap of ~120 MiB on the dev machine, so the
engine calls it between steps at most once per `interval_s` (5 s: <= 0.25% of a core).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _libc_function(symbol: str) -> Callable[..., int] | None:
    """A glibc extension by name; None where the C library lacks it (musl, macOS)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c")), symbol, None)
    except OSError:
        return None


_malloc_trim = _libc_function("malloc_trim")
_mallopt = _libc_function("mallopt")
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's HEAP_MAX_SIZE / 2 on 64-bit: mallopt refuses above it


def set_mmap_threshold(nbytes: int) -> bool:
    """Fix glibc's mmap threshold at `nbytes` for the whole process: every allocation at least
    that big is its own mapping, unmapped (its pages gone from RSS) the moment it is freed.

    By default glibc raises the threshold to the size of each mapped chunk freed (up to 32 MiB),
    so after the first big activation dies, activations of that size come from the heap and stay
    resident until the next trim: RSS then swings between the heap's high-water mark and the
    trimmed floor (the MiniLM embeddings server, four runs of 1,600 requests: 7.5-13%
    fluctuation; 1.8-2.2% with the threshold at 1 MiB, 1.1% at 128 KiB, none gained at 4 MiB).
    It costs throughput (1 MiB: 12-24% fewer requests a second) as every mapping's pages fault
    in anew, so it is opt-in. False where the C library has no mallopt or refuses the value."""
    if _mallopt is None or not 0 < nbytes <= MMAP_THRESHOLD_MAX:
        return False
    return bool(_mallopt(_M_MMAP_THRESHOLD, nbytes))


def trim_host_heap() -> bool:
    """Return free heap pages to the OS; False where the C library has no malloc_trim (musl,
    macOS), where this is a no-op."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


class HeapTrimmer:
    """Rate-limits `trim_host_heap` to once per `interval_s` (0 turns it off)."""

    def __init__(self, interval_s: float, trim: Callable[[], bool] | None = None) -> None:
        self.interval_s = interval_s
        self._trim = trim or trim_host_heap
        self._next_at: float | None = None  # first trim one interval after the first call
        self.num_trims = 0

    def maybe_trim(self, now: float) -> bool:
        if self.interval_s <= 0:
            return False
        if self._next_at is None:
            self._next_at = now + self.interval_s
            return False
        if now < self._next_at:
            return False
        self._next_at = now + self.interval_s
        self.num_trims += 1
        self._trim()
        return True
