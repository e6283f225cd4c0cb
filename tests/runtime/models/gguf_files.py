"""Tiny GGUF files for tests, written with llama.cpp's own writer (`gguf.GGUFWriter`) from the
tiny HF checkpoints of builders.py, laid out as llama.cpp's converter lays them out: llama's q/k
rows in adjacent-pair rope order (qwen2's left as HF has them), llama.cpp tensor names, 2-D weights
in `qtype`, norms and biases in F32, no `output.weight` when the embedding is tied.

    write_gguf(build_llama(tmp / "m"), tmp / "m.gguf", qtype="Q8_0")
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.gguf_export import pair_rope_rows
from runtime.models.checkpoint import open_checkpoint
from runtime.models.loader import read_args

_NAMES = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf: str) -> str:
    base, kind = hf.rsplit(".", 1)
    if base.startswith("model.layers."):
        _, _, layer, rest = base.split(".", 3)
        return f"blk.{layer}.{_NAMES[rest]}.{kind}"
    return f"{_NAMES[base]}.{kind}"


def write_gguf(model_dir: Path, out: Path, *, qtype: str = "F32", arch: str | None = None) -> Path:
    import gguf

    args = read_args(model_dir)
    arch = arch or ("qwen2" if args.architecture == "Qwen2ForCausalLM" else "llama")
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_context_length(args.max_position_embeddings)
    writer.add_embedding_length(args.hidden_size)
    writer.add_block_count(args.num_layers)
    writer.add_feed_forward_length(args.intermediate_size)
    writer.add_head_count(args.num_heads)
    writer.add_head_count_kv(args.num_kv_heads)
    writer.add_rope_dimension_count(args.head_dim)
    writer.add_rope_freq_base(args.rope_theta)
    writer.add_layer_norm_rms_eps(args.norm_eps)
    writer.add_vocab_size(args.vocab_size)
    writer.add_tokenizer_model("gpt2")
    # a byte-level vocab of the right size: the tests here feed ids, not text
    tokens = [f"<t{i}>" for i in range(args.vocab_size)]
    writer.add_token_list(tokens)
    writer.add_token_types([1] * args.vocab_size)
    writer.add_token_merges([])
    source = open_checkpoint(model_dir, legacy_support=False)
    quant = gguf.GGMLQuantizationType[qtype]
    for hf in source.names():
        if hf == "lm_head.weight" and args.tie_word_embeddings:
            continue
        tensor = source.get(hf).float()
        if arch == "llama" and ".q_proj." in hf:
            tensor = pair_rope_rows(tensor, args.num_heads)
        elif arch == "llama" and ".k_proj." in hf:
            tensor = pair_rope_rows(tensor, args.num_kv_heads)
        array = np.ascontiguousarray(tensor.numpy(), dtype=np.float32)
        if array.ndim == 2 and qtype != "F32":
            packed = gguf.quants.quantize(array, quant)
            writer.add_tensor(gguf_name(hf), packed, raw_dtype=quant)
        else:
            writer.add_tensor(gguf_name(hf), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
