"""Loading one tensor-parallel rank's shard of a checkpoint: each rank reads only its slices
(`TensorSource.get_narrow`: a sliced read of the safetensors mmap, never the whole tensor),
builds an ordinary `CausalLM` of `shard_args`' shape, and turns its o_proj / down_proj into
row-parallel projections (runtime.models.parallel.comm).

Sources: safetensors (and legacy .bin under legacy support) read their slices directly; GGUF
tensors are block-quantized and rope-permuted whole, so each one is decoded, narrowed and the
rest dropped (one tensor at a time). Weight-only quantization at load (int8 / int4) quantizes
the rank's float slices, so scales are per row of the slice (int4 groups run along the input
features of the slice). Checkpoints stored quantized (`fastllm convert --quantize`) are refused
under TP with one line: their packed rows would need splitting with their scales, not done yet.
"""

from __future__ import annotations

from pathlib import Path

import torch

from runtime.errors import ConfigError
from runtime.models import quant_checkpoint
from runtime.models.base import CausalLM
from runtime.models.gguf_io.reader import is_gguf
from runtime.models.layers import DecoderLayer
from runtime.models.loader import (
    MODEL_CLASSES,
    LoadedModel,
    read_state,
    resolve_device,
    resolve_dtype,
)
from runtime.models.meta import meta_build
from runtime.models.parallel.comm import make_row_parallel
from runtime.models.parallel.gather import ShardGather
from runtime.models.parallel.shard import ShardSpec, check_tp, shard_args
from runtime.models.parallel.source import ShardedSource, open_source
from runtime.models.quantize import quantize_head, quantize_model


def load_shard(
    path: str | Path,
    spec: ShardSpec,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    legacy_support: bool = False,
    load_tokenizer: bool = True,
    quantization: str | None = None,
    quant_group_size: int = 32,
    quantize_lm_head: bool = False,
) -> LoadedModel:
    """Rank `spec.rank`'s model: `args` of the result are the shard's (its heads, KV heads and
    intermediate size), so the engine sizes this rank's KV pool for its heads alone."""
    path = Path(path)
    torch_dtype, torch_device = resolve_dtype(dtype), resolve_device(device)
    full_args, source, file = open_source(path, legacy_support)
    if source.metadata.get(quant_checkpoint.META_METHOD):
        raise ConfigError(
            f"{path} holds pre-quantized weights, which tensor parallelism cannot split yet; "
            "serve the float checkpoint with --quantization instead",
            param="tensor_parallel_size",
        )
    check_tp(full_args, spec.world)
    args = shard_args(full_args, spec.world)
    state = read_state(args, ShardedSource(source, full_args, spec), torch_dtype, torch_device)
    with meta_build():
        model = MODEL_CLASSES[args.arch](args)
    model.load_state_dict(state, strict=True, assign=True)
    model.eval().requires_grad_(False)
    summary = None
    if quantization is not None and quantization != "none":
        summary = quantize_model(model, quantization, group_size=quant_group_size)
        if quantize_lm_head:
            quantize_head(model, summary)
    assert isinstance(model, CausalLM)
    # plain attributes (nn.Module types its setattr): a shard's own forward is not the model's,
    # so rank 0's reference path (runtime.verify) gathers the other ranks' layers
    vars(model)["tp_world"] = spec.world
    if spec.is_sharded and spec.rank == 0:
        vars(model)["tp_gather"] = ShardGather(
            path,
            spec.world,
            dtype=torch_dtype,
            device=torch_device,
            legacy_support=legacy_support,
            quantization=quantization,
            quant_group_size=quant_group_size,
            norm_offset=model.norm_offset,
            act=model.mlp_act,
        )
    if spec.is_sharded:
        for layer in model.layers:
            assert isinstance(layer, DecoderLayer)
            make_row_parallel(layer.attn.o_proj)
            make_row_parallel(layer.mlp.down_proj)
    tokenizer = None
    if load_tokenizer:
        if is_gguf(path):
            from runtime.models.gguf_io.tokenizer import load_gguf_tokenizer

            tokenizer = load_gguf_tokenizer(file)  # type: ignore[arg-type]
        else:
            from runtime.models.tokenizer import Tokenizer

            tokenizer = Tokenizer.from_dir(path)
    loaded = LoadedModel(
        model, args, tokenizer, torch_device, torch_dtype, path, source.is_legacy, source.metadata
    )
    loaded.quantization = summary
    return loaded
