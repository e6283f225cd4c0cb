"""Threads: scripted workers hammer one allocator while a checker verifies, under the allocator's
lock, that the counters equal the sums over live records at that instant."""

from __future__ import annotations

import collections
import threading

import hypothesis.strategies as st
import torch
from hypothesis import HealthCheck, given, settings

from runtime.memory import Allocator
from runtime.memory.config import TIERS
from tests.runtime.memory.conftest import TINY

OPS = st.one_of(
    st.tuples(st.just("alloc"), st.sampled_from([3, 16, 100, 255, 300, 700, 1024, 1100, 1500])),
    st.tuples(st.sampled_from(["view", "raw", "release", "drop_raw"]), st.integers(0, 50)),
)
SCRIPTS = st.lists(st.lists(OPS, min_size=5, max_size=60), min_size=2, max_size=4)


def check_consistent(alloc: Allocator) -> None:
    with alloc._lock:  # an instant when no thread is inside the allocator
        alloc._collect_locked()
        in_use, count = collections.Counter[str](), collections.Counter[str]()
        for rec in alloc._live:
            in_use[rec.tier] += rec.reserved
            count[rec.tier] += 1
        for name, c in alloc._counters.items():
            assert c.bytes_in_use == in_use[name], name
            assert c.live_blocks == count[name], name
            assert c.releases + c.leaks <= c.hits + c.misses, name


def worker(alloc: Allocator, wid: int, script: list, errors: list) -> None:
    held: list[tuple] = []  # (block, value, views, raws)
    zombies: list[tuple[torch.Tensor, float]] = []  # raw aliases of released blocks
    try:
        for n, (op, arg) in enumerate(script):
            if op == "alloc":
                value = float(wid * 10_000 + n)
                block = alloc.alloc((arg,), torch.float32, owner=f"w{wid}")
                block.tensor.fill_(value)
                held.append((block, value, [], []))
            elif held:
                block, value, views, raws = held[arg % len(held)]
                if op == "view":
                    views.append(block[arg % 3 :])
                elif op == "raw":
                    raws.append(block.tensor[:1])
                elif op == "drop_raw" and zombies:
                    raw, old = zombies.pop(arg % len(zombies))
                    assert torch.all(raw == old), "memory reused under a live alias"
                elif op == "release":
                    # nothing else may have been handed this memory while we held it
                    assert torch.all(block.tensor == value), "block overwritten while alive"
                    if arg % 2:  # keep an alias past the release: the old pool bug's victim
                        raws.append(block.tensor.view(-1)[-1:])
                    for v in views:
                        v.release()
                    block.release()
                    held.remove((block, value, views, raws))
                    zombies.extend((r, value) for r in raws)
        for block, value, views, _ in held:
            assert torch.all(block.tensor == value), "block overwritten while alive"
            for v in views:
                v.release()
            block.release()
        for raw, old in zombies:
            assert torch.all(raw == old), "memory reused under a live alias"
    except BaseException as exc:  # surfaced by the test thread
        errors.append(exc)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scripts=SCRIPTS)
def test_concurrent_alloc_view_release_keeps_the_books(scripts: list) -> None:
    alloc = Allocator(TINY)
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=worker, args=(alloc, i, s, errors)) for i, s in enumerate(scripts)
    ]
    stop = threading.Event()

    def checker() -> None:
        try:
            while not stop.is_set():
                check_consistent(alloc)
                alloc.leak_report()
        except BaseException as exc:
            errors.append(exc)

    watch = threading.Thread(target=checker)
    watch.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watch.join()
    assert not errors, errors
    check_consistent(alloc)
    stats = alloc.stats()
    assert stats.bytes_in_use == 0 and stats.live_blocks == 0
    num_allocs = sum(op == "alloc" for s in scripts for op, _ in s)
    per_tier = {t.tier: t for t in stats.tiers}
    assert set(per_tier) == set(TIERS)
    assert sum(t.hits + t.misses for t in stats.tiers) == num_allocs
    assert sum(t.releases for t in stats.tiers) == num_allocs
    assert sum(t.leaks for t in stats.tiers) == 0
