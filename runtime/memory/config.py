"""Allocator configuration and the size-class arithmetic shared by the tiers.

Tiers by request size (bytes = numel * itemsize):
    small   nbytes <  small_max_bytes            power-of-two classes, a fixed slab of blocks each
    medium  small_max_bytes <= nbytes <= medium_max_bytes
                                                 classes spaced 1/medium_classes_per_doubling of a
                                                 doubling (<= 25% waste at 4); freed blocks cached
    large   nbytes >  medium_max_bytes           never cached; memory handed back on release
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.errors import ConfigError

SMALL, MEDIUM, LARGE = "small", "medium", "large"
TIERS = (SMALL, MEDIUM, LARGE)


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True)
class AllocatorConfig:
    small_max_bytes: int = 1 << 20  # requests below this are small (power of two)
    medium_max_bytes: int = 10 << 20  # requests up to this are medium; above it, large
    min_block_bytes: int = 1 << 10  # smallest small class (power of two); also slot alignment
    small_blocks_per_class: int = 32  # preallocated blocks per small class (one slab per class)
    medium_cache_bytes: int = 256 << 20  # cap on cached (free) medium bytes; LRU eviction above
    medium_classes_per_doubling: int = 4  # medium class spacing; 4 -> at most 25% rounding waste
    # after a large block dies: malloc_trim(0) on CPU (glibc), empty_cache() on CUDA
    return_large_to_os: bool = True

    def __post_init__(self) -> None:
        if self.min_block_bytes < 16:
            raise ConfigError("min_block_bytes must be >= 16 (slot alignment)")
        if not _is_pow2(self.min_block_bytes) or not _is_pow2(self.small_max_bytes):
            raise ConfigError("min_block_bytes and small_max_bytes must be powers of two")
        if not self.min_block_bytes <= self.small_max_bytes <= self.medium_max_bytes:
            raise ConfigError("need min_block_bytes <= small_max_bytes <= medium_max_bytes")
        if self.small_blocks_per_class < 0 or self.medium_cache_bytes < 0:
            raise ConfigError("small_blocks_per_class and medium_cache_bytes must be >= 0")
        if not _is_pow2(self.medium_classes_per_doubling):
            raise ConfigError("medium_classes_per_doubling must be a power of two")

    @classmethod
    def from_settings(cls, settings: Any) -> AllocatorConfig:
        """Map `runtime.config.Settings` allocator_* fields (absent fields keep the defaults)."""
        names: tuple[str, ...] = ("small_max_bytes", "medium_max_bytes", "small_blocks_per_class")
        names += ("medium_cache_bytes",)
        values = {n: getattr(settings, f"allocator_{n}", None) for n in names}
        return cls(**{k: v for k, v in values.items() if v is not None})

    @property
    def min_block_shift(self) -> int:
        return self.min_block_bytes.bit_length() - 1

    @property
    def num_small_classes(self) -> int:
        # classes min_block_bytes, 2x, ..., small_max_bytes (a request just under small_max rounds
        # up to small_max itself)
        return self.small_max_bytes.bit_length() - self.min_block_bytes.bit_length() + 1

    def small_class_bytes(self, index: int) -> int:
        return self.min_block_bytes << index

    def small_class_index(self, nbytes: int) -> int:
        """Index of the smallest power-of-two class >= nbytes (nbytes < small_max_bytes)."""
        return max((nbytes - 1).bit_length() - self.min_block_shift, 0)

    def medium_class_bytes(self, nbytes: int) -> int:
        """nbytes rounded up to the next medium class boundary."""
        step = max((1 << ((nbytes - 1).bit_length() - 1)) // self.medium_classes_per_doubling, 1)
        return -(-nbytes // step) * step

    def tier_of(self, nbytes: int) -> str:
        if nbytes < self.small_max_bytes:
            return SMALL
        return MEDIUM if nbytes <= self.medium_max_bytes else LARGE
