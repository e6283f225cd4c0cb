"""Declarative weight-name tables: HF checkpoint tensor name -> this runtime's parameter name.

Several HF tensors may map to one parameter (fused Q/K/V, fused gate/up); they are concatenated
along dim 0 in table order. Each row carries the shape the checkpoint tensor must have.
`IGNORED` lists checkpoint tensors that are known and deliberately unused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from runtime.models.config import ModelArgs


@dataclass(frozen=True)
class WeightEntry:
    hf_name: str  # name in the checkpoint
    target: str  # parameter name in our module
    shape: tuple[int, ...]  # expected shape of the checkpoint tensor


IGNORED: dict[str, tuple[str, ...]] = {
    "llama": (r"\.rotary_emb\.inv_freq$",),
    "gemma": (r"\.rotary_emb\.inv_freq$",),
    "bert": (r"^embeddings\.position_ids$", r"^pooler\.dense\.(weight|bias)$"),
}


def is_ignored(args: ModelArgs, name: str) -> bool:
    if args.tie_word_embeddings and name == "lm_head.weight":
        return True  # some tied checkpoints also store the (identical) head
    return any(re.search(p, name) for p in IGNORED[args.arch])


def weight_table(args: ModelArgs) -> list[WeightEntry]:
    return _bert_table(args) if args.arch == "bert" else _decoder_table(args)


def _decoder_table(args: ModelArgs) -> list[WeightEntry]:
    hidden, inter, q, kv = args.hidden_size, args.intermediate_size, args.q_size, args.kv_size
    rows = [
        WeightEntry("model.embed_tokens.weight", "embed_tokens.weight", (args.vocab_size, hidden)),
        WeightEntry("model.norm.weight", "norm.weight", (hidden,)),
    ]
    if not args.tie_word_embeddings:
        rows.append(WeightEntry("lm_head.weight", "lm_head.weight", (args.vocab_size, hidden)))
    for i in range(args.num_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        rows += [
            WeightEntry(src + "input_layernorm.weight", dst + "input_norm.weight", (hidden,)),
            WeightEntry(
                src + "post_attention_layernorm.weight", dst + "post_attn_norm.weight", (hidden,)
            ),
        ]
        for part, size in (("q", q), ("k", kv), ("v", kv)):
            name = f"{src}self_attn.{part}_proj."
            rows.append(WeightEntry(name + "weight", dst + "attn.qkv_proj.weight", (size, hidden)))
            if args.qkv_bias:
                rows.append(WeightEntry(name + "bias", dst + "attn.qkv_proj.bias", (size,)))
        rows.append(
            WeightEntry(src + "self_attn.o_proj.weight", dst + "attn.o_proj.weight", (hidden, q))
        )
        if args.o_bias:
            rows.append(
                WeightEntry(src + "self_attn.o_proj.bias", dst + "attn.o_proj.bias", (hidden,))
            )
        for part in ("gate", "up"):
            name = f"{src}mlp.{part}_proj."
            rows.append(
                WeightEntry(name + "weight", dst + "mlp.gate_up_proj.weight", (inter, hidden))
            )
            if args.mlp_bias:
                rows.append(WeightEntry(name + "bias", dst + "mlp.gate_up_proj.bias", (inter,)))
        rows.append(
            WeightEntry(src + "mlp.down_proj.weight", dst + "mlp.down_proj.weight", (hidden, inter))
        )
        if args.mlp_bias:
            rows.append(
                WeightEntry(src + "mlp.down_proj.bias", dst + "mlp.down_proj.bias", (hidden,))
            )
    return rows


def _bert_table(args: ModelArgs) -> list[WeightEntry]:
    hidden, inter, q = args.hidden_size, args.intermediate_size, args.q_size
    rows = [
        WeightEntry(
            "embeddings.word_embeddings.weight", "word_embeddings.weight", (args.vocab_size, hidden)
        ),
        WeightEntry(
            "embeddings.position_embeddings.weight",
            "position_embeddings.weight",
            (args.max_position_embeddings, hidden),
        ),
        WeightEntry(
            "embeddings.token_type_embeddings.weight",
            "token_type_embeddings.weight",
            (args.type_vocab_size, hidden),
        ),
        WeightEntry("embeddings.LayerNorm.weight", "embed_norm.weight", (hidden,)),
        WeightEntry("embeddings.LayerNorm.bias", "embed_norm.bias", (hidden,)),
    ]
    linear = {  # HF module -> (our module, out features, in features)
        "attention.self.query": ("qkv", q, hidden),
        "attention.self.key": ("qkv", q, hidden),
        "attention.self.value": ("qkv", q, hidden),
        "attention.output.dense": ("attn_out", hidden, q),
        "attention.output.LayerNorm": ("attn_norm", hidden, 0),
        "intermediate.dense": ("inter", inter, hidden),
        "output.dense": ("out", hidden, inter),
        "output.LayerNorm": ("out_norm", hidden, 0),
    }
    for i in range(args.num_layers):
        for hf_module, (ours, out_features, in_features) in linear.items():
            src, dst = f"encoder.layer.{i}.{hf_module}.", f"layers.{i}.{ours}."
            weight_shape = (out_features, in_features) if in_features else (out_features,)
            rows.append(WeightEntry(src + "weight", dst + "weight", weight_shape))
            rows.append(WeightEntry(src + "bias", dst + "bias", (out_features,)))
    return rows
