"""`GraphDecoder`: the model's decode call captured as CUDA graphs, per batch-size bucket.

At small batches a CUDA decode step is bound by kernel launches (~30 per layer), not by the
GPU. Each bucket B (1, 2, 4, 8, 16, 24, 32, ...) captures the model's own forward (its
`embed`, each `DecoderLayer`'s two halves, its final norm) once, at load, on
static buffers of B rows; a step of T <= B tokens copies its ids and rotary rows into the first
T rows and replays (padding rows compute on stale, finite inputs; every piece is row-wise, so
they never touch the real rows, and their outputs are never read).

The attention core (`Attention.attend`: KV writes into the pages, one gathered SDPA) is not
captured: its shapes change every step and it belongs to the KV/attention work. So a step is
num_layers + 1 graph replays with the attention core run eagerly between them (vLLM's
"piecewise" capture), i.e. `DecoderLayer.forward` cut at its attend call:

    graph 0          model.embed, layer 0.attn_in                   -> q, k, v
    attend(layer 0)  eager; its output copied into the static attn buffer
    graph i          layer i-1.attn_out_mlp, layer i.attn_in        -> q, k, v
    ...
    graph L          layer L-1.attn_out_mlp, model.norm             -> hidden [B, H]

Prefill (and any step with more tokens than the largest bucket) runs the uncaptured forward.
All buckets share one graph memory pool, captured from the largest down, as vLLM does.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from runtime.models.base import CausalLM
from runtime.models.batch_plan import BatchPlan, SeqSlice
from runtime.models.layers import DecoderLayer


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then steps of 8 up to 32, then of 16: <= 8 rows of padding up to 32."""
    sizes = [1, 2, 4, 8, 16, 24, 32, *range(48, max(max_batch, 1) + 16, 16)]
    return tuple(sorted({min(s, max_batch) for s in sizes if s <= max_batch} | {max_batch}))


@dataclass
class _Bucket:
    size: int
    ids: Tensor  # [B] long, static input
    cos: Tensor  # [B, 1, D] static input (rope rows)
    sin: Tensor
    attn: Tensor  # [B, q_size] static input: the attention core's output for the next graph
    graphs: list[torch.cuda.CUDAGraph]  # num_layers + 1
    qkv: list[tuple[Tensor, Tensor, Tensor]]  # static outputs of graphs 0..L-1
    x: Tensor | None = None  # [B, H] the residual stream, made by graph 0, updated in place
    hidden: Tensor | None = None  # static output of graph L, [B, H]


class GraphDecoder:
    def __init__(self, model: CausalLM, max_batch: int) -> None:
        self.model = model
        self.layers = [cast(DecoderLayer, layer) for layer in model.layers]
        self.rope = model.rope_table()
        args = model.args
        self.q_size, self.group = args.q_size, args.num_heads // args.num_kv_heads
        self.buckets: dict[int, _Bucket] = {}
        self.sizes = batch_buckets(max_batch)
        self.num_replays = 0  # steps served from a captured graph (tests, doctor)
        self._lock = threading.Lock()  # the static buffers serve one step at a time
        self._pool = torch.cuda.graph_pool_handle()
        weight = model.embed_tokens.weight
        self.device, self.dtype = weight.device, weight.dtype

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def capture(self) -> None:
        """All buckets, largest first; at load, never on a request."""
        for size in sorted(self.sizes, reverse=True):
            self.buckets[size] = self._capture_bucket(size)
        torch.cuda.synchronize(self.device)

    def _capture_bucket(self, size: int) -> _Bucket:
        rope, d = self.rope, self.model.args.head_dim
        bucket = _Bucket(
            size=size,
            ids=torch.zeros(size, dtype=torch.long, device=self.device),
            cos=rope.cos[:1].expand(size, 1, d).clone(),
            sin=rope.sin[:1].expand(size, 1, d).clone(),
            attn=torch.zeros(size, self.q_size, dtype=self.dtype, device=self.device),
            graphs=[],
            qkv=[],
        )
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):  # warm-up: cuBLAS handles, kernel selection, lazy inits
                self._pieces(bucket, warmup=True)
            torch.cuda.synchronize(self.device)
            x: Tensor | None = None
            for i in range(len(self.layers) + 1):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool, stream=stream):
                    x = self._piece(bucket, i, x)
                bucket.graphs.append(graph)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        return bucket

    def _pieces(self, bucket: _Bucket, *, warmup: bool) -> None:
        x: Tensor | None = None
        for i in range(len(self.layers) + 1):
            x = self._piece(bucket, i, x, keep=not warmup)

    def _piece(self, bucket: _Bucket, i: int, x: Tensor | None, keep: bool = True) -> Tensor:
        """Graph i's work; records its static outputs on the bucket when `keep`."""
        if i == 0:
            x = self.model.embed(bucket.ids)
            if keep:
                bucket.x = x  # graphs 1..L update it in place: it must outlive the capture
        else:
            assert x is not None
            x = self.layers[i - 1].attn_out_mlp(x, bucket.attn)
        if i == len(self.layers):
            hidden = self.model.norm(x)
            if keep:
                bucket.hidden = hidden
            return hidden
        qkv = self.layers[i].attn_in(x, bucket.cos, bucket.sin)
        if keep:
            bucket.qkv.append(qkv)
        return x

    def bucket_for(self, num_tokens: int) -> int | None:
        return next((s for s in self.sizes if s >= num_tokens), None)

    @torch.inference_mode()
    def __call__(self, input_ids: Tensor, seqs: Sequence[SeqSlice]) -> Tensor:
        """Like `CausalLM.forward`: hidden [T, H] (a copy: the static buffers serve the next
        step; engines sharing one loaded model may call from several threads)."""
        num_tokens = input_ids.shape[0]
        size = self.bucket_for(num_tokens)
        if size is None:  # more tokens than the largest bucket: uncaptured
            return self.model(input_ids, seqs)
        with self._lock:
            return self._replay(self.buckets[size], input_ids, seqs)

    def _replay(self, bucket: _Bucket, input_ids: Tensor, seqs: Sequence[SeqSlice]) -> Tensor:
        num_tokens = input_ids.shape[0]
        plan = BatchPlan.build(seqs, input_ids, self.group)
        bucket.ids[:num_tokens].copy_(input_ids)
        # the model's current table: a later engine on the same model may have enlarged it
        self.model.rope_table().lookup(plan.positions, out=(bucket.cos, bucket.sin))
        bucket.graphs[0].replay()
        for i, layer in enumerate(self.layers):
            q, k, v = bucket.qkv[i]
            out = layer.attn.attend(q[:num_tokens], k[:num_tokens], v[:num_tokens], plan)
            bucket.attn[:num_tokens].copy_(out)
            bucket.graphs[i + 1].replay()
        self.num_replays += 1
        assert bucket.hidden is not None
        return bucket.hidden[:num_tokens].clone()
