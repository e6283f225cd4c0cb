"""Leak attribution: held blocks are listed with their owner; dropped ones reclaimed, counted."""

from __future__ import annotations

import gc
import logging

import pytest
import torch

from runtime.memory import Allocator

F32 = torch.float32


def test_a_held_block_appears_in_the_leak_report_with_its_owner(tiny: Allocator) -> None:
    held = tiny.alloc((3, 5), F32, owner="req-leaky")  # deliberately never released
    done = tiny.alloc((8,), F32, owner="req-done")
    done.release()
    report = tiny.leak_report()
    assert len(report) == 1
    entry = report[0]
    assert entry.owner == "req-leaky"
    assert entry.nbytes == 3 * 5 * 4
    assert entry.reserved_bytes == held.reserved_bytes
    assert entry.tier == "small"
    assert entry.shape == (3, 5) and entry.dtype == "float32"
    assert entry.age_s >= 0.0 and entry.num_handles == 1 and not entry.is_released


def test_report_is_oldest_first(tiny: Allocator) -> None:
    blocks = [tiny.alloc((4,), F32, owner=f"o{i}") for i in range(3)]
    assert [b.owner for b in tiny.leak_report()] == ["o0", "o1", "o2"]
    for b in blocks:
        b.release()


@pytest.mark.parametrize("numel", [16, 600, 2000])
def test_a_dropped_block_is_reclaimed_and_counted_with_its_owner(
    tiny: Allocator, numel: int, caplog: pytest.LogCaptureFixture
) -> None:
    block = tiny.alloc((numel,), F32, owner="req-dropped")
    tier = block.tier
    view = block[:1]
    del block  # the view still holds the block: not dead yet
    assert tiny.stats().live_blocks == 1
    with caplog.at_level(logging.WARNING, logger="runtime.memory.allocator"):
        del view
        stats = {t.tier: t for t in tiny.stats().tiers}
    assert stats[tier].leaks == 1
    assert stats[tier].bytes_in_use == 0 and stats[tier].live_blocks == 0
    assert stats[tier].releases == 0
    [event] = tiny.recent_leaks()
    assert event.owner == "req-dropped" and event.tier == tier
    assert "req-dropped" in caplog.text
    assert tiny.leak_report() == []


def test_a_leak_inside_a_reference_cycle_is_reclaimed_by_the_gc(tiny: Allocator) -> None:
    class Holder:
        pass

    h = Holder()
    h.self = h  # type: ignore[attr-defined]
    h.block = tiny.alloc((16,), F32, owner="cyclic")  # type: ignore[attr-defined]
    del h
    gc.collect()
    assert [e.owner for e in tiny.recent_leaks()] == ["cyclic"]
    assert tiny.stats().bytes_in_use == 0
