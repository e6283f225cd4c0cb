"""Per-sequence KV storage.

`SequenceKV` is what the models read and write: one tensor per sequence,
`data[num_layers, 2, num_kv_heads, capacity, head_dim]` (index 0 = keys, 1 = values).
A model's forward writes the new tokens' K/V at positions [num_tokens, num_tokens + n) of every
layer and attends over [0, num_tokens + n); the caller then calls `advance(n)` once. The model never
advances the cursor itself, so every layer of one forward sees the same `num_tokens`.

`KVCache` hands out SequenceKVs backed by allocator blocks (owner tag = sequence id) under a
byte budget; capacities are rounded up to buckets so freed blocks are reused by size class.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from runtime.memory import Allocator


class SequenceKV:
    def __init__(self, data: torch.Tensor, block: object | None = None) -> None:
        assert data.dim() == 5 and data.shape[1] == 2, "want [layers, 2, kv_heads, cap, head_dim]"
        self.data = data  # [num_layers, 2, num_kv_heads, capacity, head_dim]
        self.block = block  # the allocator block backing `data`, if any
        self.num_tokens = 0  # tokens whose K/V are already stored

    @classmethod
    def empty(
        cls,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> SequenceKV:
        """Plain storage outside any allocator (tests, reference runs)."""
        shape = (num_layers, 2, num_kv_heads, capacity, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device))

    @property
    def capacity(self) -> int:
        return int(self.data.shape[3])

    def k(self, layer: int) -> torch.Tensor:
        return self.data[layer, 0]  # [num_kv_heads, capacity, head_dim]

    def v(self, layer: int) -> torch.Tensor:
        return self.data[layer, 1]  # [num_kv_heads, capacity, head_dim]

    def advance(self, n: int) -> None:
        if self.num_tokens + n > self.capacity:
            raise ValueError(f"KV overflow: {self.num_tokens} + {n} > capacity {self.capacity}")
        self.num_tokens += n


def bucket_tokens(num_tokens: int, min_bucket: int = 64) -> int:
    """KV capacity for `num_tokens`: multiples of `min_bucket` up to 4 * min_bucket, then steps of a
    quarter of the enclosing power of two (<= 25% waste). Few distinct capacities means few
    distinct block sizes, so a finished sequence's block is reused by the next one of its class."""
    n = max(num_tokens, 1)
    step = max(min_bucket, (1 << (max(n - 1, 1).bit_length() - 1)) // 4)
    return -(-n // step) * step


class KVCache:
    """Per-sequence KV blocks drawn from the allocator, under a byte budget.

    `allocate` returns None when the budget has no room (the caller queues or preempts); `free`
    releases the block at once and empties the SequenceKV, so a stale reference fails loudly
    (capacity 0) instead of writing into memory that another sequence now owns.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        allocator: Allocator,
        max_bytes: int,
        min_bucket_tokens: int = 64,
        zero_fill: bool = True,  # fresh memory may hold NaN bit patterns; 0 * NaN poisons masks
    ) -> None:
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.dtype, self.device, self.allocator = dtype, torch.device(device), allocator
        self.max_bytes, self.min_bucket_tokens = max_bytes, min_bucket_tokens
        self.zero_fill = zero_fill
        self.bytes_per_token = num_layers * 2 * num_kv_heads * head_dim * dtype.itemsize
        self.num_used_bytes = 0  # budget taken by live sequences (capacity * bytes_per_token)
        self._seqs: dict[str, SequenceKV] = {}
        self._lock = threading.Lock()

    @property
    def num_free_bytes(self) -> int:
        return self.max_bytes - self.num_used_bytes

    @property
    def num_sequences(self) -> int:
        return len(self._seqs)

    def capacity_for(self, num_tokens: int) -> int:
        capacity = bucket_tokens(num_tokens, self.min_bucket_tokens)
        max_tokens = self.max_bytes // self.bytes_per_token
        # a sequence that fits the budget exactly must not be refused by rounding
        return max_tokens if num_tokens <= max_tokens < capacity else capacity

    def can_allocate(self, num_tokens: int) -> bool:
        return self.num_used_bytes + self.capacity_for(num_tokens) * self.bytes_per_token <= (
            self.max_bytes
        )

    def allocate(self, seq_id: str, num_tokens: int) -> SequenceKV | None:
        """KV room for `num_tokens` (rounded up to a bucket), or None when the budget is full."""
        capacity = self.capacity_for(num_tokens)
        nbytes = capacity * self.bytes_per_token
        with self._lock:
            if seq_id in self._seqs:
                raise ValueError(f"sequence {seq_id!r} already has KV")
            if self.num_used_bytes + nbytes > self.max_bytes:
                return None
            self.num_used_bytes += nbytes  # reserved before the (unlocked) allocation
        shape = (self.num_layers, 2, self.num_kv_heads, capacity, self.head_dim)
        try:
            block = self.allocator.alloc(shape, self.dtype, owner=seq_id)
            if self.zero_fill:
                block.tensor.zero_()
        except BaseException:
            with self._lock:
                self.num_used_bytes -= nbytes
            raise
        kv = SequenceKV(block.tensor, block=block)
        with self._lock:
            self._seqs[seq_id] = kv
        return kv

    def free(self, seq_id: str) -> None:
        """Release a sequence's KV; a no-op for an unknown or already freed id."""
        with self._lock:
            kv = self._seqs.pop(seq_id, None)
            if kv is None:
                return
            self.num_used_bytes -= kv.capacity * self.bytes_per_token
        block, (layers, _, heads, _, head_dim) = kv.block, kv.data.shape
        # capacity 0 from now on, and no alias left in `kv` to keep the block out of its pool
        kv.data = kv.data.new_empty((layers, 2, heads, 0, head_dim))
        kv.block, kv.num_tokens = None, 0
        if block is not None:
            self.allocator.release(block)  # type: ignore[arg-type]

    def get(self, seq_id: str) -> SequenceKV | None:
        return self._seqs.get(seq_id)

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._seqs
