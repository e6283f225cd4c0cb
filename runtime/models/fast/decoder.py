"""`FusedDecoder`: the decode step made of the fused pieces, uncaptured (any device, any T).

Same contract as `CausalLM.forward` (input_ids [T] packed + one `SeqSlice` per sequence ->
hidden [T, H] after the final norm; each layer's new K/V written, cursors not advanced), and the
same numbers up to fp32 rounding: the eager forward stays the reference it is compared with
(tests, `fastllm doctor`), and verification recomputes on its own reference path as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from runtime.models import ops
from runtime.models.base import CausalLM
from runtime.models.batch_plan import BatchPlan, SeqSlice
from runtime.models.fast.pieces import DecodeDims, LayerWeights, attn_in, attn_out_mlp
from runtime.models.fast.rope_table import RopeTable
from runtime.models.layers import DecoderLayer

AttnIn = Callable[[DecodeDims, LayerWeights, Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]
AttnOutMlp = Callable[[DecodeDims, LayerWeights, Tensor, Tensor], Tensor]


class FusedDecoder:
    def __init__(self, model: CausalLM) -> None:
        self.model = model
        weight = model.embed_tokens.weight
        self.dims = DecodeDims.of(model)
        self.weights = LayerWeights.of_model(model)
        self.rope = RopeTable(model.args, weight.dtype, weight.device)
        self.attends = [cast(DecoderLayer, layer).attn.attend for layer in model.layers]
        # gemma multiplies the embeddings by sqrt(hidden) rounded to the model dtype (as HF does)
        self.embed_scale = (
            torch.tensor(model.args.hidden_size**0.5, dtype=weight.dtype, device=weight.device)
            if model.scale_embeddings
            else None
        )
        # the pieces; `runtime.models.fast.build` may swap in torch.compile'd versions
        self.attn_in: AttnIn = attn_in
        self.attn_out_mlp: AttnOutMlp = attn_out_mlp

    @property
    def num_layers(self) -> int:
        return len(self.weights)

    def embed(self, input_ids: Tensor) -> Tensor:
        x = F.embedding(input_ids, self.model.embed_tokens.weight)  # [T, H], a fresh tensor
        return x if self.embed_scale is None else x.mul_(self.embed_scale)

    def final_norm(self, x: Tensor) -> Tensor:
        norm = self.model.norm
        return ops.rms_norm(x, norm.weight, norm.eps, offset=norm.offset)

    @torch.inference_mode()
    def __call__(self, input_ids: Tensor, seqs: Sequence[SeqSlice]) -> Tensor:
        plan = BatchPlan.build(seqs, input_ids, self.dims.group)
        cos, sin = self.rope.lookup(plan.positions)
        x = self.embed(input_ids)
        dims = self.dims
        for w, attend in zip(self.weights, self.attends, strict=True):
            q, k, v = self.attn_in(dims, w, x, cos, sin)
            x = self.attn_out_mlp(dims, w, x, attend(q, k, v, plan))
        return self.final_norm(x)
