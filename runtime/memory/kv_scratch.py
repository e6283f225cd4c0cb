"""The buffer the batched attention gathers pages into, reused by every layer and every step.

Why: a step's gather is megabytes (rows x pages x page bytes, keys and values); a fresh tensor
of that size per layer is fresh memory from the OS each time on CPU (page faults: measured ~2x
the copy itself). One buffer per KV cache (one forward runs at a time per engine) grows to the
largest gather seen (a quarter more, so a slowly growing batch does not regrow it every step)
and is kept until the cache closes: given back whenever the engine idles, it was allocated and
faulted in again at every burst (the soak saw RSS swing by its size).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from runtime.memory import Allocator, Block


class GatherScratch:
    def __init__(self, allocator: Allocator, dtype: torch.dtype, owner: str) -> None:
        self.allocator, self.dtype, self.owner = allocator, dtype, owner
        self._block: Block | None = None
        self._lock = threading.Lock()

    def take(self, numel: int) -> torch.Tensor:
        """A 1-D tensor of `numel` elements (contents undefined), valid until `release`."""
        with self._lock:
            block = self._block
            if block is None or block.tensor.numel() < numel:
                if block is not None:
                    self._block = None
                    self.allocator.release(block)
                # a quarter more than asked: a slowly growing batch does not regrow every step
                block = self._block = self.allocator.alloc(
                    (numel + numel // 4,), self.dtype, owner=self.owner
                )
            return block.tensor[:numel]

    def release(self) -> None:
        with self._lock:
            block, self._block = self._block, None
        if block is not None:
            self.allocator.release(block)
