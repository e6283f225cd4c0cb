"""Direct model calls over paged KV (what the engine's runner does, without the engine)."""

from __future__ import annotations

import itertools
import weakref

import torch

from runtime.memory import Allocator
from runtime.memory.kv_cache import KVCache
from runtime.memory.kv_pool import SequenceKV
from runtime.models import CausalLM, SeqSlice


class Pages:
    """A page pool for one model; `new(capacity)` a sequence with pages for `capacity` tokens
    (appended on demand by `step` when capacity is None)."""

    def __init__(self, model: CausalLM, num_pages: int = 64, page_size: int = 4) -> None:
        a, weight = model.args, model.embed_tokens.weight
        per_page = a.num_layers * 2 * a.num_kv_heads * a.head_dim * weight.dtype.itemsize
        self.model = model
        self.cache = KVCache(
            num_layers=a.num_layers,
            num_kv_heads=a.num_kv_heads,
            head_dim=a.head_dim,
            dtype=weight.dtype,
            device=weight.device,
            allocator=Allocator(device=weight.device),
            max_bytes=(num_pages + 1) * page_size * per_page,
            page_size=page_size,
            enable_prefix_caching=False,
        )
        self._ids = itertools.count()
        # sequences given a fixed capacity (weak: an id() could be reused by a later sequence)
        self._fixed: weakref.WeakSet[SequenceKV] = weakref.WeakSet()

    def new(self, capacity: int | None = None) -> SequenceKV:
        kv = self.cache.allocate(f"s{next(self._ids)}", [])
        if capacity is not None:
            assert self.cache.ensure(kv, capacity)
            self._fixed.add(kv)
        return kv

    def step(self, chunks: list[tuple[SequenceKV, list[int]]]) -> list[torch.Tensor]:
        """One packed forward over (kv, new tokens) pairs -> per-sequence logits; advances."""
        seqs: list[SeqSlice] = []
        ids: list[int] = []
        for kv, tokens in chunks:
            if kv not in self._fixed:
                assert self.cache.ensure(kv, len(tokens))
            seqs.append(SeqSlice(len(ids), len(ids) + len(tokens), kv))
            ids += tokens
        input_ids = torch.tensor(ids, device=self.model.embed_tokens.weight.device)
        logits = self.model.compute_logits(self.model(input_ids, seqs)).cpu()
        for seq in seqs:
            seq.kv.advance(seq.end - seq.start)
        return [logits[s.start : s.end] for s in seqs]
