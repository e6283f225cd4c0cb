"""`BatchPlan`: per-forward views into each sequence's KV storage, made once per forward and
reused by every layer, so the per-layer work per sequence is one attention call (no re-slicing
of caches, one batched copy for all new K/V)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from runtime.memory.kv_cache import SequenceKV


@dataclass
class SeqSlice:
    start: int  # this sequence's new tokens are input_ids[start:end] of the packed batch
    end: int
    kv: SequenceKV  # positions of the new tokens = kv.num_tokens + arange(end - start)


@dataclass
class BatchPlan:
    positions: Tensor  # [T] absolute position of every packed token
    lengths: list[int]  # new tokens per sequence
    pasts: list[int]  # cached tokens per sequence = its causal offset
    keys: list[tuple[Tensor, ...]]  # [layer][seq] -> [num_kv_heads, past + n, head_dim] cache view
    values: list[tuple[Tensor, ...]]
    writes: list[tuple[Tensor, ...]]  # [layer][seq] -> [2, num_kv_heads, n, head_dim] new-K/V slot

    @classmethod
    def build(cls, seqs: Sequence[SeqSlice], input_ids: Tensor) -> BatchPlan:
        positions: list[int] = []
        lengths, pasts, keys, values, writes = [], [], [], [], []
        for seq in seqs:
            n, past = seq.end - seq.start, seq.kv.num_tokens
            if seq.start != len(positions) or n < 0:
                raise ValueError(
                    f"seq slices must tile input_ids in order; got {seq.start}:{seq.end}"
                )
            if past + n > seq.kv.capacity:
                raise ValueError(f"KV overflow: {past} + {n} > capacity {seq.kv.capacity}")
            positions.extend(range(past, past + n))
            lengths.append(n)
            pasts.append(past)
            data = seq.kv.data  # [num_layers, 2, num_kv_heads, capacity, head_dim]
            keys.append(data[:, 0, :, : past + n].unbind(0))
            values.append(data[:, 1, :, : past + n].unbind(0))
            writes.append(data[:, :, :, past : past + n].unbind(0))
        if len(positions) != input_ids.shape[0]:
            raise ValueError(
                f"seq slices cover {len(positions)} tokens, input has {input_ids.shape[0]}"
            )
        return cls(
            positions=torch.tensor(positions, dtype=torch.long, device=input_ids.device),
            lengths=lengths,
            pasts=pasts,
            keys=list(zip(*keys, strict=True)),
            values=list(zip(*values, strict=True)),
            writes=list(zip(*writes, strict=True)),
        )
