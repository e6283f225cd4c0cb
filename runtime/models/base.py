"""`SeqSlice` and `CausalLM`: the decoder-only model contract the engine batches over.

One forward takes the new tokens of several sequences packed back to back (`input_ids [T]`) and
one `SeqSlice` per sequence saying where its tokens are and which `SequenceKV` holds its past.
Sequences may be at different stages (a long prefill next to one-token decodes): every linear layer
runs once over all T tokens, and attention runs once per layer over every sequence's KV pages.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from runtime.models import ops
from runtime.models.batch_plan import BatchPlan, SeqSlice
from runtime.models.config import ModelArgs
from runtime.models.cpu_kernels.stack import FusedStack
from runtime.models.layers import DecoderLayer, Linear, RMSNorm


# Rotary cos/sin for every position, computed once per model (first forward): computing the
# tables per forward costs ~10 ops (arange, pow, outer product, cat, cos, sin, casts); the forward
# looks its rows up with one `index_select` each instead (into fixed buffers when a step is
# captured, runtime.models.fast.graphs). The values are `ops.rope_cos_sin` over
# `arange(max_positions)`: elementwise the same math, so a row equals what `ops.rope_cos_sin`
# computes for that position alone, bit for bit (tested).
class RopeTable:
    def __init__(
        self,
        args: ModelArgs,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int | None = None,  # fewer rows than the declared context (CausalLM)
    ) -> None:
        positions = torch.arange(max_positions or args.max_position_embeddings, device=device)
        cos, sin = ops.rope_cos_sin(positions, args.rope_theta, args.head_dim, dtype)
        self.cos = cos.contiguous()  # [max_positions, 1, head_dim]
        self.sin = sin.contiguous()  # sign of rotate_half folded in (see ops.rotary)

    @property
    def max_positions(self) -> int:
        return int(self.cos.shape[0])

    def lookup(
        self, positions: Tensor, out: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        """positions [T] -> (cos, sin) [T, 1, head_dim]; into `out` ([>= T, 1, head_dim] each,
        the first T rows written) when given, so a captured step reads them from fixed memory."""
        if out is None:
            return self.cos.index_select(0, positions), self.sin.index_select(0, positions)
        num_tokens = positions.shape[0]
        cos, sin = out[0][:num_tokens], out[1][:num_tokens]
        torch.index_select(self.cos, 0, positions, out=cos)
        torch.index_select(self.sin, 0, positions, out=sin)
        return cos, sin


class CausalLM(nn.Module):
    """Llama-style decoder. Subclasses set the family's knobs below."""

    norm_offset = 0.0  # RMSNorm scales by (norm_offset + w)
    mlp_act = "swiglu"  # name of the gated activation in `ops`
    scale_embeddings = False  # multiply embeddings by sqrt(hidden) (in the model dtype)

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(args, i, self.norm_offset, self.mlp_act) for i in range(args.num_layers)
        )
        self.norm = RMSNorm(args.hidden_size, args.norm_eps, self.norm_offset)
        # Tied models read the embedding matrix in compute_logits; no aliased parameter to load.
        self.lm_head = (
            None if args.tie_word_embeddings else Linear(args.hidden_size, args.vocab_size, False)
        )
        # built on the first forward: the model is made on the meta device and loaded after
        self._rope: RopeTable | None = None
        # the most positions a sequence can reach (the engines' KV pools); None: the context
        self._rope_positions: int | None = None
        # lone one-token steps attend in one call of runtime.models.cpu_kernels (set at load:
        # runtime.models.loader; batch_plan's `fused_decode`)
        self.fused_decode = False
        # and go through every layer in one call where the model's projections allow it
        # (runtime.models.cpu_kernels.stack; set at load with `fused_decode`)
        self.fused_stack: FusedStack | None = None

    @torch.no_grad()
    def forward(self, input_ids: Tensor, seqs: Sequence[SeqSlice]) -> Tensor:
        """input_ids [T] packed -> hidden [T, hidden] (final norm applied).
        Writes each layer's K/V at [kv.num_tokens, kv.num_tokens + n) of each sequence's pages (its
        page table must already cover them); does NOT advance."""
        group = self.args.num_heads // self.args.num_kv_heads
        plan = BatchPlan.build(seqs, input_ids, group, fused_decode=self.fused_decode)
        cos, sin = self.rope_table().lookup(plan.positions)  # [T, 1, head_dim] each
        if plan.fused_decode and self.fused_stack is not None:
            return self.fused_step(input_ids, plan, cos, sin)
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x, plan, cos, sin)
        return self.norm(x)

    def fused_step(self, input_ids: Tensor, plan: BatchPlan, cos: Tensor, sin: Tensor) -> Tensor:
        """A step `plan.fused_decode` marks, on a model with a `fused_stack`: the lone token
        through every layer in one call (runtime.models.cpu_kernels.stack) -> hidden [1, H]."""
        assert self.fused_stack is not None and plan.lone_pages is not None
        pages, past = plan.lone_pages
        x = self.fused_stack.run(self.embed(input_ids), cos, sin, plan.pool, pages, past)
        return self.norm(x)

    def embed(self, input_ids: Tensor) -> Tensor:
        """input_ids [T] -> a fresh [T, H] (the layers update it in place)."""
        x = self.embed_tokens(input_ids)
        if self.scale_embeddings:  # sqrt(hidden) rounded to the model dtype, as HF does
            x.mul_(torch.tensor(self.args.hidden_size**0.5, dtype=x.dtype))
        return x

    def limit_positions(self, num_positions: int) -> None:
        """Rope rows for at most `num_positions` (an engine's KV pool: no sequence gets past
        it) instead of the declared context, which a checkpoint may set far beyond what this
        server can hold (a 2**24-position table is gigabytes). Engines sharing the model keep
        the largest of their limits."""
        self._rope_positions = max(self._rope_positions or 0, num_positions)

    def rope_table(self) -> RopeTable:
        """cos/sin for every reachable position on the weights' device and dtype (built once;
        engines sharing the model may race to build it: both build the same values)."""
        weight = self.embed_tokens.weight
        context = self.args.max_position_embeddings
        positions = min(context, self._rope_positions or context)
        table = self._rope
        if (
            table is None
            or table.cos.device != weight.device
            or table.cos.dtype != weight.dtype
            or table.max_positions < positions
        ):
            table = self._rope = RopeTable(self.args, weight.dtype, weight.device, positions)
        return table

    @torch.no_grad()
    def compute_logits(self, hidden: Tensor) -> Tensor:
        """hidden [N, H] -> logits [N, vocab] float32."""
        if self.lm_head is None:
            return F.linear(hidden, self.embed_tokens.weight).float()
        return self.lm_head(hidden).float()
