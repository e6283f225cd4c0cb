"""`RopeTable`: rotary cos/sin for every position, computed once per model (first forward).

Computing the tables per forward costs ~10 ops (arange, pow, outer product, cat, cos, sin,
casts); the model's forward looks its rows up with one `index_select` each instead (into fixed
buffers when a step is captured, runtime.models.fast.graphs). The values are `ops.rope_cos_sin`
over `arange(max_positions)`: elementwise the same math, so a row of the table equals what
`ops.rope_cos_sin` computes for that position alone, bit for bit (tested).
"""

from __future__ import annotations

import torch
from torch import Tensor

from runtime.models import ops
from runtime.models.config import ModelArgs


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
