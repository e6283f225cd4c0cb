"""Handles: typed misuse errors, tracked views, and raw aliases keeping memory out of the pool."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch

from runtime.errors import (
    AllocatorError,
    DoubleReleaseError,
    ForeignBlockError,
    UseAfterReleaseError,
)
from runtime.memory import Allocator, BlockView
from tests.runtime.memory.conftest import TINY

F32 = torch.float32


def test_block_tensor_has_the_shape_dtype_and_its_own_storage(tiny: Allocator) -> None:
    a = tiny.alloc((4, 8), F32, owner="a")
    b = tiny.alloc((4, 8), F32, owner="b")
    assert a.tensor.shape == (4, 8) and a.tensor.dtype == F32 and a.tensor.is_contiguous()
    assert a.tensor.untyped_storage() is not b.tensor.untyped_storage()
    assert a.tensor.data_ptr() != b.tensor.data_ptr()  # same class, different slots
    a.tensor.fill_(1.0)
    b.tensor.fill_(2.0)
    assert torch.equal(a.tensor, torch.ones(4, 8))
    a.release()
    b.release()


def test_double_release_of_block_and_view(tiny: Allocator) -> None:
    block = tiny.alloc((16,), F32, owner="x")
    view = block[2:4]
    view.release()
    with pytest.raises(DoubleReleaseError):
        view.release()
    block.release()
    with pytest.raises(DoubleReleaseError):
        tiny.release(block)
    assert isinstance(DoubleReleaseError("x"), AllocatorError)


def test_use_after_release(tiny: Allocator) -> None:
    block = tiny.alloc((16,), F32, owner="x")
    view = block.view(4, 4)
    view.release()
    with pytest.raises(UseAfterReleaseError):
        _ = view.tensor
    block.release()
    with pytest.raises(UseAfterReleaseError):
        _ = block.tensor
    with pytest.raises(UseAfterReleaseError):
        block.narrow(0, 0, 2)


def test_releasing_another_allocators_block_is_foreign(tiny: Allocator) -> None:
    other = Allocator(TINY)
    block = other.alloc((16,), F32, owner="x")
    view = block[:2]
    with pytest.raises(ForeignBlockError):
        tiny.release(block)
    with pytest.raises(ForeignBlockError):
        tiny.release(view)
    with pytest.raises(ForeignBlockError):
        tiny.release(torch.empty(3))  # type: ignore[arg-type]
    assert not block.is_released  # a refused release changes nothing
    view.release()
    block.release()
    assert other.stats().bytes_in_use == 0


def test_derive_refuses_a_non_view(tiny: Allocator) -> None:
    block = tiny.alloc((16,), F32, owner="x")
    with pytest.raises(ValueError, match="view"):
        block.derive(lambda t: t + 1)
    block.release()
    assert tiny.stats().bytes_in_use == 0


@pytest.mark.parametrize("numel", [16, 600, 2000])  # small, medium, large under TINY
def test_block_returns_only_after_base_and_all_views_are_released(
    tiny: Allocator, numel: int
) -> None:
    block = tiny.alloc((numel,), F32, owner="x")
    tier = block.tier
    v1, v2 = block[: numel // 2], block.view(numel)
    assert isinstance(v1, BlockView) and v1.block is block
    block.release()
    v1.release()
    assert tiny.stats().live_blocks == 1  # v2 still out
    assert not v2.is_released and v2.tensor.numel() == numel
    v2.release()
    stats = {t.tier: t for t in tiny.stats().tiers}
    assert stats[tier].bytes_in_use == 0
    assert stats[tier].releases == 1


@pytest.mark.parametrize("numel", [16, 600])  # pooled tiers
def test_a_raw_alias_keeps_the_memory_out_of_the_pool(tiny: Allocator, numel: int) -> None:
    block = tiny.alloc((numel,), F32, owner="old")
    block.tensor.fill_(7.0)
    raw = block.tensor[1:]  # an untracked view: the old bug's dangling view
    ptr = block.tensor.data_ptr()
    block.release()
    report = tiny.leak_report()
    assert [(b.owner, b.is_released) for b in report] == [("old", True)]
    # every new block of the class must avoid the aliased memory
    fresh = [tiny.alloc((numel,), F32, owner=f"new{i}") for i in range(4)]
    for f in fresh:
        assert f.tensor.data_ptr() != ptr
        f.tensor.fill_(-1.0)
    assert torch.all(raw == 7.0)
    del raw
    assert tiny.stats().live_blocks == len(fresh)  # the old block is back, not leaked
    assert sum(t.leaks for t in tiny.stats().tiers) == 0
    for f in fresh:
        f.release()
    assert tiny.stats().bytes_in_use == 0


def _keep_alias(kind: str, t: torch.Tensor) -> object:
    if kind == "storage":
        return t.untyped_storage()
    if kind == "numpy":
        return t.numpy()
    if kind == "dlpack":
        return torch.utils.dlpack.to_dlpack(t)
    if kind == "detach":
        return t.detach()
    if kind == "autograd":  # mul saves its input for backward: the graph aliases the block
        return t * torch.ones(t.shape, requires_grad=True)
    return t  # "tensor": the block's own tensor object, kept past release


@pytest.mark.parametrize("kind", ["storage", "numpy", "dlpack", "detach", "autograd", "tensor"])
@pytest.mark.parametrize("numel", [16, 600])  # pooled tiers: small slab slot, medium backing
def test_every_kind_of_alias_keeps_a_pooled_slot_out(
    tiny: Allocator, kind: str, numel: int
) -> None:
    block = tiny.alloc((numel,), F32, owner="old")
    block.tensor.fill_(3.0)
    ptr = block.tensor.data_ptr()
    alias = _keep_alias(kind, block.tensor)
    block.release()
    fresh = [tiny.alloc((numel,), F32, owner=f"new{i}") for i in range(3)]
    assert all(f.tensor.data_ptr() != ptr for f in fresh), f"reused under a live {kind} alias"
    assert [b.owner for b in tiny.leak_report() if b.is_released] == ["old"]
    del alias
    assert tiny.stats().live_blocks == len(fresh)  # the old block came back once the alias died
    for f in fresh:
        f.release()
    assert tiny.stats().bytes_in_use == 0


@pytest.mark.parametrize(
    "mutate",
    [
        lambda t: t.unsqueeze_(0),
        lambda t: t.t_(),
        lambda t: t.resize_(2, 2),
        lambda t: t.as_strided_((4, 4), (1, 4)),
        lambda t: t.set_(torch.empty(16).untyped_storage()),
        lambda t: t.requires_grad_(True),
    ],
)
@pytest.mark.parametrize("numel", [16, 600])
def test_in_place_metadata_changes_do_not_reach_the_next_owner(
    tiny: Allocator, mutate: Callable[[torch.Tensor], object], numel: int
) -> None:
    """Slots reuse their tensor object: whatever the last owner did to its metadata is undone."""
    shape = (4, numel // 4)
    block = tiny.alloc(shape, F32, owner="old")
    mutate(block.tensor)
    block.release()
    blocks = [tiny.alloc(shape, F32, owner=f"new{i}") for i in range(3)]
    for b in blocks:
        t = b.tensor
        assert t.shape == shape and t.is_contiguous() and t.storage_offset() == 0
        assert not t.requires_grad
        t.fill_(1.0)
    del t  # an alias: it would keep the last block out of its pool
    spans = sorted((b.tensor.data_ptr(), b.tensor.data_ptr() + b.reserved_bytes) for b in blocks)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), "blocks overlap"
    for b in blocks:
        b.release()
    assert tiny.stats().bytes_in_use == 0 and tiny.leak_report() == []
