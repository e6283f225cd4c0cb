"""runtime.models.parallel's slices, without processes: every rank's slices of every checkpoint
tensor put back together are the tensor (safetensors and GGUF sources), a row-parallel bias is
rank 0's alone, KV heads fewer than the ranks are replicated in head order, and a rank's model
built from `shard_args` takes exactly the sliced state."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from runtime.models.checkpoint import TensorSource, open_checkpoint
from runtime.models.config import ModelArgs
from runtime.models.gguf_io.reader import open_gguf
from runtime.models.gguf_io.source import GGUFSource
from runtime.models.loader import read_args, read_state
from runtime.models.parallel.load import ShardedSource, load_shard
from runtime.models.parallel.shard import ShardSpec, shard_args, slice_of
from tests.runtime.models.gguf_files import write_gguf


def _sources(model_dir: Path, tmp_path: Path) -> list[tuple[TensorSource, ModelArgs]]:
    args = read_args(model_dir)
    gguf = open_gguf(write_gguf(model_dir, tmp_path / "model.gguf"))
    return [
        (open_checkpoint(model_dir, legacy_support=False), args),
        (GGUFSource(gguf, args), args),
    ]


@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_rank_slices_put_together_are_the_tensor(
    arch: str, demo_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    world = 2
    for source, args in _sources(demo_model_dir(arch), tmp_path):
        shards = [ShardedSource(source, args, ShardSpec(r, world)) for r in range(world)]
        for name in source.names():
            full = source.get(name)
            parts = [s.get(name) for s in shards]
            piece = slice_of(args, name, tuple(full.shape), ShardSpec(1, world))
            if piece is None:  # replicated
                assert all(torch.equal(p, full) for p in parts), name
            elif piece.zero:  # a row-parallel bias: rank 0 holds it, the sum is the bias
                assert torch.equal(parts[0] + parts[1], full), name
            elif args.num_kv_heads < world and (".k_proj." in name or ".v_proj." in name):
                assert all(torch.equal(p, full) for p in parts), name  # one KV head, both ranks
            else:
                assert torch.equal(torch.cat(parts, piece.dim), full), name
            for shard in shards:
                assert tuple(shard.get(name).shape) == shard.shape(name), name


def test_shard_state_fits_the_shard_model(demo_model_dir: Callable[[str], Path]) -> None:
    from runtime.models.families import LlamaForCausalLM

    model_dir = demo_model_dir("llama")
    args = read_args(model_dir)
    sharded = shard_args(args, 2)
    assert (sharded.num_heads, sharded.num_kv_heads, sharded.intermediate_size) == (2, 1, 88)
    source = ShardedSource(open_checkpoint(model_dir, legacy_support=False), args, ShardSpec(1, 2))
    state = read_state(sharded, source, torch.float32, torch.device("cpu"))
    with torch.device("meta"):
        model = LlamaForCausalLM(sharded)
    model.load_state_dict(state, strict=True, assign=True)  # every name, every shape
    assert model.layers[0].attn.o_proj.weight_t.shape == (2 * args.head_dim, args.hidden_size)


def test_gguf_shard_equals_safetensors_shard(
    demo_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """The same rank's shard from the checkpoint and from its F32 GGUF export: equal weights
    (the GGUF path decodes each tensor, restores rope rows, then narrows)."""
    model_dir = demo_model_dir("llama")
    gguf = write_gguf(model_dir, tmp_path / "model.gguf")
    spec = ShardSpec(1, 2)
    from_dir = load_shard(model_dir, spec, load_tokenizer=False).model.state_dict()
    from_gguf = load_shard(gguf, spec, load_tokenizer=False).model.state_dict()
    assert from_dir.keys() == from_gguf.keys()
    for name, tensor in from_dir.items():
        assert torch.equal(tensor, from_gguf[name]), name
