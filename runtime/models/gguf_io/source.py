"""A GGUF file as a `TensorSource` under HF checkpoint names, so `read_state` (names and shapes
checked against the weight table before any data is read) loads it like safetensors.

Two layout facts undone here, per tensor, on demand:
- names: llama.cpp's `blk.{i}.attn_q.weight` etc. -> HF `model.layers.{i}.self_attn.q_proj.weight`.
- rope rows (llama only): llama.cpp's converter reorders each head's q and k rows from HF's
  half-split order (dim i pairs with i + D/2) into adjacent pairs (2i, 2i + 1). Reading back,
  row 2i + s of a head returns to row s * D/2 + i. qwen2 files keep HF's order (llama.cpp rotates
  them NEOX-style), so nothing is undone there.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import Tensor

from runtime.errors import ModelLoadError
from runtime.models.checkpoint import TensorSource
from runtime.models.config import ModelArgs
from runtime.models.gguf_io.reader import DEQUANTIZABLE, GGUFFile, GGUFTensor, dequantize

_GLOBAL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK = {
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
_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
# tensors llama.cpp writes that HF checkpoints do not hold (precomputed rope tables)
_SKIPPED = re.compile(r"^(rope_freqs|rope_factors_(long|short))\.weight$")


def hf_name(name: str) -> str | None:
    """GGUF tensor name -> HF checkpoint name (None: a name we do not know)."""
    base, _, kind = name.rpartition(".")
    if base in _GLOBAL and kind in ("weight", "bias"):
        return f"{_GLOBAL[base]}.{kind}"
    match = _BLOCK_NAME.match(name)
    if match and match.group(2) in _BLOCK:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_BLOCK[part]}.{kind}"
    return None


def unpair_rope_rows(weight: Tensor, num_heads: int) -> Tensor:
    """[num_heads * D, ...] in llama.cpp's adjacent-pair order -> HF's half-split order."""
    rows, *rest = weight.shape
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *rest).transpose(1, 2).reshape(rows, *rest)


class GGUFSource(TensorSource):
    """HF name -> dequantized tensor (float32, rope rows restored). `on_tensor(name)` is called
    as each tensor is read (progress)."""

    def __init__(self, file: GGUFFile, args: ModelArgs) -> None:
        by_hf: dict[str, GGUFTensor] = {}
        for name, tensor in file.tensors.items():
            target = hf_name(name)
            if target is None:
                if _SKIPPED.match(name):
                    continue
                raise ModelLoadError(
                    f"{file.path}: unexpected tensor {name!r} for {file.architecture}"
                )
            if tensor.ggml_type not in DEQUANTIZABLE:  # refused before any data is read
                raise ModelLoadError(
                    f"{file.path}: tensor {name!r} has type {tensor.ggml_type}, which is not "
                    f"supported (supported: {', '.join(DEQUANTIZABLE)})"
                )
            by_hf[target] = tensor
        metadata = {
            "fastllm.converted_from": "gguf",
            "fastllm.gguf_file": file.path.name,
            "fastllm.gguf_types": ",".join(f"{k}:{v}" for k, v in file.tensor_types.items()),
        }
        super().__init__(dict(by_hf), is_legacy=False, metadata=metadata)
        self.file = file
        self.args = args
        self._by_hf = by_hf
        self.on_tensor: Callable[[str], None] | None = None

    def names(self) -> list[str]:
        return list(self._by_hf)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._by_hf[name].shape

    def gguf_tensor(self, name: str) -> GGUFTensor:
        """The packed tensor behind an HF name (type, shape, raw bytes), before dequantizing."""
        return self._by_hf[name]

    def get(self, name: str) -> Tensor:
        tensor = dequantize(self.file.path, self._by_hf[name], torch.float32)
        if self.args.architecture == "LlamaForCausalLM":
            if ".self_attn.q_proj." in name:
                tensor = unpair_rope_rows(tensor, self.args.num_heads)
            elif ".self_attn.k_proj." in name:
                tensor = unpair_rope_rows(tensor, self.args.num_kv_heads)
        if self.on_tensor is not None:
            self.on_tensor(name)
        return tensor
