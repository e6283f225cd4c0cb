"""A tiny allocator config whose tier thresholds small tensors cross: small < 1 KiB (64 B .. 1 KiB
classes, 2 slots each), medium 1–4 KiB (cache cap 6 KiB), large > 4 KiB."""

from __future__ import annotations

import ctypes
import errno
import os

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


def resident_bytes(address: int, nbytes: int) -> int:
    """Bytes of [address, address + nbytes) resident in RAM, by mincore(2); 0 once unmapped.

    Whole-process RSS is a noisy witness in a shared xdist worker (other tests' threads free and
    allocate at the same time); asking the kernel about this one range is not.
    """
    page = os.sysconf("SC_PAGE_SIZE")
    start = address - address % page
    pages = (address + nbytes - start + page - 1) // page
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * page), vec) != 0:
        if ctypes.get_errno() == errno.ENOMEM:  # part of the range is no longer mapped
            return 0
        raise OSError(ctypes.get_errno(), "mincore failed")
    return sum(v & 1 for v in vec) * page
