"""Write a llama checkpoint (HF layout, safetensors) as an f32 GGUF that llama.cpp loads.

    write_gguf(Path("/tmp/llama-small"), Path("/tmp/llama-small-f32.gguf"))

Used by `bench.peer` to run llama.cpp on the very weights this runtime serves. f32 throughout
(no quantisation), so both sides do the same arithmetic up to summation order.

Two layout facts:
- rope: HF llama rotates the halves of each head (dim i with i + D/2), llama.cpp's LLAMA arch
  rotates adjacent pairs (2i, 2i + 1). The q and k projection rows are permuted per head from the
  half-split order into the pair order; q·k is unchanged because both sides get the same order.
- vocab: the bench feeds token ids, not text, so the GGUF carries no tokenizer
  (`tokenizer.ggml.model = "no_vocab"` with `vocab_size` dummy tokens: llama.cpp sizes its
  vocab from that, and the embedding matrix must match it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from runtime.models.checkpoint import open_checkpoint
from runtime.models.config import ModelArgs
from runtime.models.loader import read_args


def pair_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[num_heads * D, ...] rows in HF's half-split order -> llama.cpp's adjacent-pair order:
    within a head, row s * D/2 + i (s = 0, 1) moves to row 2 i + s."""
    rows, *rest = weight.shape
    half = rows // num_heads // 2
    return weight.reshape(num_heads, 2, half, *rest).transpose(1, 2).reshape(rows, *rest)


def _tensor_names(args: ModelArgs) -> dict[str, str]:
    """GGUF name -> HF name (llama.cpp's llama tensor names)."""
    names = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    }
    if args.tie_word_embeddings:
        del names["output.weight"]  # llama.cpp reuses token_embd when output is absent
    parts = {
        "attn_norm": "input_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_norm": "post_attention_layernorm",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    for i in range(args.num_layers):
        for ours, hf in parts.items():
            names[f"blk.{i}.{ours}.weight"] = f"model.layers.{i}.{hf}.weight"
    return names


def write_gguf(model_dir: Path, out_path: Path) -> Path:
    import gguf  # the bench's optional extra (`pip install gguf`)

    args = read_args(model_dir)
    if args.arch != "llama" or args.qkv_bias or args.o_bias or args.mlp_bias:
        raise ValueError(f"{model_dir}: only bias-free llama checkpoints convert here")
    writer = gguf.GGUFWriter(str(out_path), "llama")
    writer.add_name(model_dir.name)
    writer.add_context_length(args.max_position_embeddings)
    writer.add_embedding_length(args.hidden_size)
    writer.add_block_count(args.num_layers)
    writer.add_feed_forward_length(args.intermediate_size)
    writer.add_head_count(args.num_heads)
    writer.add_head_count_kv(args.num_kv_heads)
    writer.add_key_length(args.head_dim)
    writer.add_value_length(args.head_dim)
    writer.add_rope_dimension_count(args.head_dim)
    writer.add_rope_freq_base(args.rope_theta)
    writer.add_layer_norm_rms_eps(args.norm_eps)
    writer.add_vocab_size(args.vocab_size)
    writer.add_tokenizer_model("no_vocab")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    source = open_checkpoint(model_dir, legacy_support=False)
    for name, hf_name in _tensor_names(args).items():
        tensor = source.get(hf_name).float()
        if name.endswith("attn_q.weight"):
            tensor = pair_rope_rows(tensor, args.num_heads)
        elif name.endswith("attn_k.weight"):
            tensor = pair_rope_rows(tensor, args.num_kv_heads)
        writer.add_tensor(name, np.ascontiguousarray(tensor.numpy(), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
