"""Gemma family: GeGLU MLP (tanh GELU), (1 + w) RMSNorm, embeddings scaled by sqrt(hidden),
head_dim independent of hidden / heads (carried by ModelArgs.head_dim)."""

from __future__ import annotations

from runtime.models.base import CausalLM


class GemmaForCausalLM(CausalLM):
    norm_offset = 1.0
    mlp_act = "geglu"
    scale_embeddings = True
