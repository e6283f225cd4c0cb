"""The reference path on a tensor-parallel shard (runtime.models.parallel.gather): rank 0's
model holds a slice of each projection, the reference gathers the other ranks' layers from the
checkpoint and sums their partial products. Its chosen-token logits must be those of the
reference on the whole model (no process group needed: the reference never runs the shard's
forward, whose all_reduces would)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from runtime.models.base import CausalLM
from runtime.models.loader import load_model
from runtime.models.parallel.load import load_shard
from runtime.models.parallel.shard import ShardSpec
from runtime.verify.reference import reference_forward

SEQS = [(list(range(40, 75)), 7), ([5, 17, 33, 99, 100], 12)]


def _reference(model: object, layer: int = 1) -> list[float]:
    assert isinstance(model, CausalLM)
    return reference_forward(model, SEQS, capture_layer=layer).chosen_logits


@pytest.mark.parametrize("arch", ["llama", "gemma"])  # gemma: one KV head, on every rank
def test_shard_reference_equals_whole_model_reference(
    arch: str, demo_model_dir: Callable[[str], Path]
) -> None:
    model_dir = demo_model_dir(arch)
    whole = load_model(model_dir, device="cpu", load_tokenizer=False).model
    shard = load_shard(model_dir, ShardSpec(0, 2), load_tokenizer=False).model
    assert shard.args.num_heads == whole.args.num_heads // 2  # a shard indeed
    expected = _reference(whole)
    got = _reference(shard)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=1e-5, rtol=0)
    # without the gathered ranks, the shard's own reference is another number entirely
    del vars(shard)["tp_gather"]
    partial = torch.tensor(_reference(shard))
    assert (partial - torch.tensor(expected)).abs().max() > 1e-2


def test_quantized_shard_gathers_the_workers_quantization(
    demo_model_dir: Callable[[str], Path],
) -> None:
    """int8 at load: each rank quantizes its own slices; the gathered layer of rank 1 is what
    rank 1's own load builds, code for code."""
    model_dir = demo_model_dir("llama")
    rank0 = load_shard(model_dir, ShardSpec(0, 2), load_tokenizer=False, quantization="int8")
    rank1 = load_shard(model_dir, ShardSpec(1, 2), load_tokenizer=False, quantization="int8")
    gathered = rank0.model.tp_gather.layers(1)  # type: ignore[operator]
    assert len(gathered) == 1
    own = rank1.model.layers[1]
    for path in ("attn.qkv_proj", "attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        got, want = gathered[0].get_submodule(path), own.get_submodule(path)
        assert getattr(got, "method", None) == "int8"
        assert torch.equal(got.weight, want.weight), path
