"""The attention core over pages against the per-sequence reference: random K/V in random pages,
batches of prefill chunks and decodes side by side, every query tile the plan can pick."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from runtime.memory import Allocator
from runtime.memory.kv_cache import KVCache
from runtime.memory.kv_pool import SequenceKV
from runtime.models import ops
from runtime.models.batch_plan import (
    GATHER_BUDGET_BYTES,
    KEY_GROUP_CALL_COST,
    MAX_KEY_GROUPS,
    BatchPlan,
    SeqSlice,
    _key_group_cuts,
    attend,
)

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
        [(3 + 37 * i % 400, 1) for i in range(24)],  # decodes of spread lengths: key groups
        [(300, 9)] + [(3 + 37 * i % 400, 1) for i in range(12)],  # ... beside a chunk
        [(17, 5)],  # a lone continuation chunk
    ],
    ids=[
        "decodes",
        "chunk+decode",
        "prefills",
        "long+decodes",
        "fresh",
        "spread",
        "spread+chunk",
        "continuation",
    ],
)
def test_one_call_matches_each_sequence_alone(shape: list[tuple[int, int]]) -> None:
    g = torch.Generator().manual_seed(len(shape))
    cache = make_cache(num_pages=3000)
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
    if len(shape) > 12:  # the spread cases: rows in several groups, out of their order
        assert len(plan.key_groups) > 1 and plan.query_index is not None
    if len(plan.key_groups) == 1 and plan.q_tile == 1:  # one group keeps the rows' order
        assert plan.query_index is None and plan.output_index is None
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
    longest = max(g.num_keys for g in plan.key_groups)
    row_bytes = longest * 2 * HKV * D * 4
    assert plan.num_rows * row_bytes <= max(31 * row_bytes, GATHER_BUDGET_BYTES)
    # the short rows are not padded to the long one's table: they form a group of their own
    gathered = sum(g.num_rows * g.num_keys * 2 * HKV * D * 4 for g in plan.key_groups)
    assert plan.gather_out is not None and plan.gather_out.numel() * 4 == gathered
    assert plan.key_groups[0].num_rows == 30
    assert plan.key_groups[0].num_keys == 3 * BLOCK  # 9 tokens: 3 pages
    assert gathered < 2 * row_bytes  # the long row's block and 30 short ones, not 31 long ones


def brute_force_cost(pages: list[int], unit: int) -> int:
    """The least cost over every way to cut sorted rows into at most MAX_KEY_GROUPS groups."""
    n, best = len(pages), None
    for k in range(MAX_KEY_GROUPS):
        for inner in itertools.combinations(range(1, n), k):
            cuts = [0, *inner, n]
            cost = sum(
                (b - a) * pages[b - 1] * unit + KEY_GROUP_CALL_COST
                for a, b in itertools.pairwise(cuts)
            )
            best = cost if best is None else min(best, cost)
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(30))
def test_key_group_cuts_are_the_cheapest(seed: int) -> None:
    rng = random.Random(seed)
    pages = sorted(rng.choice([1, 2, 3, 8, 20, 40, 41, 90]) for _ in range(rng.randint(1, 9)))
    unit = rng.choice([40, 400, 4000])
    cuts = _key_group_cuts(pages, unit)
    assert cuts[0] == 0 and cuts[-1] == len(pages) and cuts == sorted(set(cuts))
    assert len(cuts) - 1 <= MAX_KEY_GROUPS
    cost = sum(
        (b - a) * pages[b - 1] * unit + KEY_GROUP_CALL_COST for a, b in itertools.pairwise(cuts)
    )
    assert cost == brute_force_cost(pages, unit)


def test_equal_rows_make_one_group_and_far_apart_ones_two() -> None:
    assert _key_group_cuts([5] * 32, 400) == [0, 32]
    assert _key_group_cuts([2] * 16 + [90] * 16, 400) == [0, 16, 32]
