"""What the reference path (runtime.verify.reference) gathers on rank 0 to recompute a
tensor-parallel model whole: the other ranks' shards of one decoder layer at a time.

Rank 0 holds only its own slices, and the workers' memory cannot be read from the verifier's
thread without stepping into the per-step protocol (their collectives belong to the engine
loop). So the other ranks' slices are read here from the checkpoint the workers loaded, through
the same `ShardedSource` and the same quantization at load: the layer built for rank r holds
what rank r's model holds. The reference then sums the ranks' partial products itself, in fp32
with the `*_ref` ops, one layer at a time (at most one layer of every other rank in memory).

A production logit that disagrees with it points at a kernel, the all_reduce or a worker; the
slices themselves are checked against `transformers` by tests/runtime/engine/test_tp.py.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from torch import nn

from runtime.models.checkpoint import TensorSource
from runtime.models.config import ModelArgs
from runtime.models.layers import DecoderLayer
from runtime.models.meta import meta_build
from runtime.models.parallel.shard import ShardSpec, shard_args
from runtime.models.parallel.source import ShardedSource, open_source
from runtime.models.quantize import quantize_model
from runtime.models.weights import weight_table


class ShardGather:
    """Rank 0's handle on the checkpoint, for the other ranks' layers (see the module doc)."""

    def __init__(
        self,
        path: Path,
        world: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        legacy_support: bool,
        quantization: str | None,
        quant_group_size: int,
        norm_offset: float,
        act: str,
    ) -> None:
        self.path, self.world, self.dtype, self.device = path, world, dtype, device
        self.legacy_support = legacy_support
        self.quantization = None if quantization in (None, "none") else quantization
        self.quant_group_size = quant_group_size
        self.norm_offset, self.act = norm_offset, act
        self._lock = threading.Lock()
        self._opened: tuple[ModelArgs, TensorSource] | None = None

    def _source(self) -> tuple[ModelArgs, TensorSource]:
        """Opened on first use, on the verifier's thread (never while the engine loads)."""
        with self._lock:
            if self._opened is None:
                full_args, source, _ = open_source(self.path, self.legacy_support)
                self._opened = (full_args, source)
            return self._opened

    def layers(self, index: int) -> list[DecoderLayer]:
        """Layer `index` of ranks 1..world-1, as each of those ranks' models holds it."""
        full_args, source = self._source()
        args = shard_args(full_args, self.world)
        prefix = f"layers.{index}."
        entries = [e for e in weight_table(args) if e.target.startswith(prefix)]
        out = []
        for rank in range(1, self.world):
            sharded = ShardedSource(source, full_args, ShardSpec(rank, self.world))
            parts: dict[str, list[torch.Tensor]] = {}
            for entry in entries:  # fused targets (qkv, gate_up) collect their parts in order
                tensor = sharded.get(entry.hf_name).to(device=self.device, dtype=self.dtype)
                parts.setdefault(entry.target[len(prefix) :], []).append(tensor)
            state = {k: v[0] if len(v) == 1 else torch.cat(v) for k, v in parts.items()}
            with meta_build():
                layer = DecoderLayer(args, index, self.norm_offset, self.act)
            layer.load_state_dict(state, strict=True, assign=True)
            if self.quantization is not None:  # as the worker quantized its shard at load
                holder = nn.Module()
                holder.layers = nn.ModuleList([layer])  # what quantize_model walks
                quantize_model(holder, self.quantization, group_size=self.quant_group_size)
            out.append(layer)
        return out
