"""A tiny allocator config whose tier thresholds small tensors cross: small < 1 KiB (64 B .. 1 KiB
classes, 2 slots each), medium 1–4 KiB (cache cap 6 KiB), large > 4 KiB."""

from __future__ import annotations

import gc

import psutil
import pytest

from runtime.memory import Allocator, AllocatorConfig

TINY = AllocatorConfig(
    small_max_bytes=1024,
    medium_max_bytes=4096,
    min_block_bytes=64,
    small_blocks_per_class=2,
    medium_cache_bytes=6000,
    medium_classes_per_doubling=4,
    return_large_to_os=False,  # malloc_trim per tiny large block would only slow the tests
)


@pytest.fixture
def tiny() -> Allocator:
    return Allocator(TINY)


def rss_bytes() -> int:
    """This process's resident set, after a collection (so dead tensors are freed first)."""
    gc.collect()
    return int(psutil.Process().memory_info().rss)
