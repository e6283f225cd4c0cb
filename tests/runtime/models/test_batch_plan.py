"""The attention core over pages against the per-sequence reference: random K/V in random pages,
batches of prefill chunks and decodes side by side, every query tile the plan can pick."""

from __future__ import annotations

import pytest
import torch

from runtime.memory import Allocator
from runtime.memory.kv_cache import KVCache
from runtime.memory.kv_pool import SequenceKV
from runtime.models import ops
from runtime.models.batch_plan import GATHER_BUDGET_BYTES, BatchPlan, SeqSlice, attend

HQ, HKV, D, BLOCK = 4, 2, 8, 4


def make_cache(num_pages: int = 400) -> KVCache:
    return KVCache(
        num_layers=1,
        num_kv_heads=HKV,
        head_dim=D,
        dtype=torch.float32,
        device="cpu",
        allocator=Allocator(),
        max_bytes=(num_pages + 1) * BLOCK * 2 * HKV * D * 4,
        page_size=BLOCK,
        enable_prefix_caching=False,
    )


def fill(kv: SequenceKV, past: torch.Tensor) -> None:
    """Store `past` ([2, Hkv, n, D]) as the sequence's first n tokens."""
    for pos in range(past.shape[2]):
        kv.data[0, :, :, kv.page_ids[pos // BLOCK], pos % BLOCK] = past[:, :, pos]
    kv.num_tokens = past.shape[2]


@pytest.mark.parametrize(
    "interleaved", [False, True], ids=["pages-in-one-run", "pages-interleaved"]
)
@pytest.mark.parametrize("n", [1, 6], ids=["decode", "chunk"])
def test_a_lone_sequence_reads_a_view_of_its_run_or_gathers(interleaved: bool, n: int) -> None:
    """One run of pages: attention over a view of the pool (no gather); pages interleaved with
    another sequence's: the gather. Both equal the reference over the same keys."""
    g = torch.Generator().manual_seed(n)
    cache = make_cache()
    kv, other = cache.allocate("a", []), cache.allocate("b", [])
    past = 13
    for _ in range(-(-(past + n) // BLOCK)):  # a page at a time, alternating when interleaved
        assert cache.ensure(kv, (len(kv.page_ids) + 1) * BLOCK - kv.num_tokens)
        if interleaved:
            assert cache.ensure(other, (len(other.page_ids) + 1) * BLOCK)
    old = torch.randn(2, HKV, past, D, generator=g)
    fill(kv, old)
    q = torch.randn(n, HQ, D, generator=g)
    k, v = torch.randn(2, n, HKV, D, generator=g)
    plan = BatchPlan.build([SeqSlice(0, n, kv)], torch.zeros(n, dtype=torch.long), HQ // HKV)
    assert (plan.lone_run is None) == interleaved
    assert (plan.gather_out is None) == (not interleaved)
    got = attend(plan, 0, q, k, v)
    keys = torch.cat([old[0], k.transpose(0, 1)], dim=1)
    values = torch.cat([old[1], v.transpose(0, 1)], dim=1)
    want = ops.attention_ref(q.transpose(0, 1), keys, values, causal_offset=past)
    torch.testing.assert_close(got.transpose(0, 1), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "shape",
    [
        [(9, 1), (30, 1), (3, 1)],  # decodes of different lengths (tile 1)
        [(6, 4), (11, 1)],  # a chunk beside a decode (tile 4)
        [(0, 7), (0, 3)],  # two fresh prefills
        [(64, 40)] + [(5 + i, 1) for i in range(20)],  # a long chunk beside many decodes
        [(0, 13)],  # a lone fresh prefill (attends to its own new K/V)
        [(17, 5)],  # a lone continuation chunk
    ],
    ids=["decodes", "chunk+decode", "prefills", "long+decodes", "fresh", "continuation"],
)
def test_one_call_matches_each_sequence_alone(shape: list[tuple[int, int]]) -> None:
    g = torch.Generator().manual_seed(len(shape))
    cache = make_cache()
    slices, pasts, news, start = [], [], [], 0
    for i, (past, n) in enumerate(shape):
        kv = cache.allocate(f"s{i}", [])
        assert cache.ensure(kv, past + n)
        old = torch.randn(2, HKV, past, D, generator=g)
        fill(kv, old)
        slices.append(SeqSlice(start, start + n, kv))
        pasts.append(old)
        news.append((torch.randn(n, HQ, D, generator=g), torch.randn(2, n, HKV, D, generator=g)))
        start += n
    q = torch.cat([x[0] for x in news])  # [T, Hq, D]
    k = torch.cat([x[1][0] for x in news])  # [T, Hkv, D]
    v = torch.cat([x[1][1] for x in news])
    plan = BatchPlan.build(slices, torch.zeros(start, dtype=torch.long), HQ // HKV)
    got = attend(plan, 0, q, k, v)  # [T, Hq, D]
    for sl, old in zip(slices, pasts, strict=True):
        n = sl.end - sl.start
        keys = torch.cat([old[0], k[sl.start : sl.end].transpose(0, 1)], dim=1)
        values = torch.cat([old[1], v[sl.start : sl.end].transpose(0, 1)], dim=1)
        want = ops.attention_ref(
            q[sl.start : sl.end].transpose(0, 1), keys, values, causal_offset=old.shape[2]
        )
        assert want.shape[1] == n
        torch.testing.assert_close(got[sl.start : sl.end].transpose(0, 1), want, atol=1e-5, rtol=0)
    # the new K/V went to their slots
    last = slices[-1]
    pos = last.kv.num_tokens
    page = last.kv.page_ids[pos // BLOCK]
    torch.testing.assert_close(last.kv.data[0, 0, :, page, pos % BLOCK], k[last.start])


def test_a_long_context_beside_short_ones_keeps_the_gather_bounded() -> None:
    cache = make_cache(num_pages=3000)
    slices, start = [], 0
    for i, (past, n) in enumerate([(4000, 400)] + [(8, 1)] * 30):
        kv = cache.allocate(f"s{i}", [])
        assert cache.ensure(kv, past + n)
        kv.num_tokens = past
        slices.append(SeqSlice(start, start + n, kv))
        start += n
    plan = BatchPlan.build(slices, torch.zeros(start, dtype=torch.long), HQ // HKV)
    row_bytes = plan.num_keys * 2 * HKV * D * 4
    assert plan.num_rows * row_bytes <= max(31 * row_bytes, GATHER_BUDGET_BYTES)
    assert plan.gather_out is not None and plan.gather_out.numel() * 4 == plan.num_rows * row_bytes
