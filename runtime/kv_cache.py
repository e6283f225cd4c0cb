"""Per-sequence KV storage.

`SequenceKV` is what the models read and write: one tensor per sequence,
`data[num_layers, 2, num_kv_heads, capacity, head_dim]` (index 0 = keys, 1 = values).
A model's forward writes the new tokens' K/V at positions [num_tokens, num_tokens + n) of every
layer and attends over [0, num_tokens + n); the caller then calls `advance(n)` once. The model never
advances the cursor itself, so every layer of one forward sees the same `num_tokens`.
"""

from __future__ import annotations

import torch


class SequenceKV:
    def __init__(self, data: torch.Tensor, block: object | None = None) -> None:
        assert data.dim() == 5 and data.shape[1] == 2, "expected [layers, 2, kv_heads, cap, head_dim]"
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

    @property
    def num_free_slots(self) -> int:
        return self.capacity - self.num_tokens

    def k(self, layer: int) -> torch.Tensor:
        return self.data[layer, 0]  # [num_kv_heads, capacity, head_dim]

    def v(self, layer: int) -> torch.Tensor:
        return self.data[layer, 1]  # [num_kv_heads, capacity, head_dim]

    def advance(self, n: int) -> None:
        if self.num_tokens + n > self.capacity:
            raise ValueError(f"KV overflow: {self.num_tokens} + {n} > capacity {self.capacity}")
        self.num_tokens += n
