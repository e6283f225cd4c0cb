"""LLaMA family (Llama, Mistral, Qwen2): RMSNorm, RoPE, grouped-query attention, SwiGLU MLP."""

from __future__ import annotations

from runtime.models.base import CausalLM


class LlamaForCausalLM(CausalLM):
    norm_offset = 0.0
    mlp_act = "swiglu"
    scale_embeddings = False
