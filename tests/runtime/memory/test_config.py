from __future__ import annotations

import pytest

from runtime.errors import ConfigError
from runtime.memory import LARGE, MEDIUM, SMALL, AllocatorConfig
from tests.runtime.memory.conftest import TINY


def test_tier_boundaries_follow_the_config() -> None:
    assert TINY.tier_of(1) == SMALL
    assert TINY.tier_of(1023) == SMALL
    assert TINY.tier_of(1024) == MEDIUM
    assert TINY.tier_of(4096) == MEDIUM
    assert TINY.tier_of(4097) == LARGE
    default = AllocatorConfig()
    assert default.tier_of((1 << 20) - 1) == SMALL
    assert default.tier_of(10 << 20) == MEDIUM
    assert default.tier_of((10 << 20) + 1) == LARGE


@pytest.mark.parametrize("nbytes", [1, 63, 64, 65, 100, 511, 512, 513, 1000, 1023])
def test_small_class_is_the_smallest_power_of_two_that_fits(nbytes: int) -> None:
    cls = TINY.small_class_bytes(TINY.small_class_index(nbytes))
    assert cls >= nbytes and cls >= TINY.min_block_bytes
    assert cls == TINY.min_block_bytes or cls // 2 < nbytes
    assert TINY.small_class_index(nbytes) < TINY.num_small_classes


@pytest.mark.parametrize(
    "nbytes", [1024, 1025, 1300, 2047, 2048, 2049, 3000, 4096, 3 << 20, 10 << 20]
)
def test_medium_class_wastes_at_most_a_quarter(nbytes: int) -> None:
    cls = TINY.medium_class_bytes(nbytes)
    assert nbytes <= cls <= nbytes * 1.25
    assert TINY.medium_class_bytes(cls) == cls  # a class size is its own class


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_block_bytes": 100},
        {"small_max_bytes": 3000},
        {"small_max_bytes": 1 << 21, "medium_max_bytes": 1 << 20},
        {"small_blocks_per_class": -1},
        {"medium_classes_per_doubling": 3},
        {"min_block_bytes": 8},
    ],
)
def test_invalid_config_is_a_config_error(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        AllocatorConfig(**kwargs)


def test_from_settings_maps_allocator_fields() -> None:
    from runtime.config import load_settings

    s = load_settings(allocator_small_blocks_per_class=3, allocator_medium_cache_bytes=1 << 20)
    cfg = AllocatorConfig.from_settings(s)
    assert cfg.small_blocks_per_class == 3
    assert cfg.medium_cache_bytes == 1 << 20
    assert cfg.small_max_bytes == s.allocator_small_max_bytes
