"""The decoder families: one forward (runtime.models.base, layers.py), told apart by three class
attributes.

LLaMA (Llama, Mistral, Qwen2): RMSNorm, RoPE, grouped-query attention, SwiGLU MLP.
Gemma: GeGLU MLP (tanh GELU), (1 + w) RMSNorm, embeddings scaled by sqrt(hidden), head_dim
independent of hidden / heads (carried by ModelArgs.head_dim).
"""

from __future__ import annotations

from runtime.models.base import CausalLM


class LlamaForCausalLM(CausalLM):
    norm_offset = 0.0
    mlp_act = "swiglu"
    scale_embeddings = False


class GemmaForCausalLM(CausalLM):
    norm_offset = 1.0
    mlp_act = "geglu"
    scale_embeddings = True
