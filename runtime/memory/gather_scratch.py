"""The buffer the batched attention gathers pages into: one per KV cache (kv_cache.py), reused
by every layer and every step."""

from __future__ import annotations

import threading

import torch


# The buffer the batched attention gathers pages into, reused by every layer and every step.
#
# Why reused: a step's gather is megabytes (rows x pages x page bytes, keys and values); a fresh
# tensor of that size per layer is fresh memory from the OS each time on CPU (page faults: measured
# ~2x the copy itself). One buffer per KV cache (one forward runs at a time per engine) grows to the
# largest gather seen (a quarter more, so a slowly growing batch does not regrow it every step) and
# is kept until the cache closes: given back whenever the engine idled, it was allocated and
# faulted in again at every burst (the soak saw RSS swing by its size).
#
# Why not an allocator block: it is working memory of the forward, like the activations, not KV
# that someone holds; in the allocator it would sit on top of the page pool (which is the whole KV
# budget, `fastllm_memory_total{type="allocator"}`) and grow with the largest batch seen, which is
# exactly what the memory-growth alert watches the allocator for. It shows in the process RSS.
class GatherScratch:
    """The buffer the batched attention gathers pages into, reused by every layer and step."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device
        self._buffer: torch.Tensor | None = None
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        buffer = self._buffer
        return 0 if buffer is None else buffer.numel() * buffer.element_size()

    def take(self, numel: int) -> torch.Tensor:
        """A 1-D tensor of `numel` elements (contents undefined), valid until `release`."""
        with self._lock:
            buffer = self._buffer
            if buffer is None or buffer.numel() < numel:
                self._buffer = None  # the old one goes before the new one is made
                del buffer
                buffer = self._buffer = torch.empty(
                    numel + numel // 4, dtype=self.dtype, device=self.device
                )
            return buffer[:numel]

    def release(self) -> None:
        with self._lock:
            self._buffer = None
