"""Heap trimming: free pages in the middle of the glibc heap go back to the OS, at most once per
interval from the engine loop."""

from __future__ import annotations

import ctypes
import gc
import platform

import pytest

from runtime.memory import HeapTrimmer, trim_host_heap
from tests.runtime.memory.conftest import resident_bytes

MIB = 1 << 20


def _address(chunk: bytearray) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(chunk))


def test_trim_returns_fragmented_free_heap_pages() -> None:
    # 64 KiB chunks sit below glibc's mmap threshold, so they come from the heap; keeping every
    # 16th pins the heap's top, so free() alone cannot give the freed ones back
    chunks = [bytearray(64 << 10) for _ in range(2000)]  # ~125 MiB, every page written
    keep = chunks[::16]
    freed = [(_address(c), len(c)) for i, c in enumerate(chunks) if i % 16]
    del chunks
    gc.collect()

    # the kernel's word on these ranges, not whole-process RSS: other tests' threads in this
    # xdist worker allocate and free at the same time
    def resident() -> int:
        return sum(resident_bytes(a, n) for a, n in freed)

    fragmented = resident()
    trimmed = trim_host_heap()
    if platform.libc_ver()[0] != "glibc":  # musl, macOS: no malloc_trim, trimming is a no-op
        pytest.skip("heap trimming needs glibc's malloc_trim")
    assert trimmed, "glibc without a malloc_trim the engine can find: trimming is silently off"
    after = resident()
    assert fragmented > 80 * MIB, "free() returned the pages; nothing left to trim"
    assert fragmented - after > 60 * MIB, f"trim gave back {(fragmented - after) // MIB} MiB"
    assert len(keep) == 125


def test_trimmer_runs_at_most_once_per_interval() -> None:
    calls: list[float] = []
    now = [0.0]
    trimmer = HeapTrimmer(10.0, trim=lambda: calls.append(now[0]) is None)
    for t in (0.0, 5.0, 9.9, 10.0, 12.0, 19.9, 20.0, 35.0):
        now[0] = t
        trimmer.maybe_trim(t)
    assert calls == [10.0, 20.0, 35.0]  # the first call only starts the clock
    assert trimmer.num_trims == 3


def test_zero_interval_turns_trimming_off() -> None:
    trimmer = HeapTrimmer(0.0, trim=lambda: pytest.fail("trimmed while off"))
    assert not any(trimmer.maybe_trim(t) for t in (0.0, 100.0, 1e6))


# Run in a fresh interpreter: the threshold is process-wide and would outlive the test. Freed
# 2 MiB chunks sandwiched between live 100 KiB ones: heap chunks stay resident (free() only trims
# the top), mapped chunks are unmapped at once.
_SANDWICH = """
import sys, psutil
from runtime.memory.host_heap import set_mmap_threshold
threshold = int(sys.argv[1])
if threshold:
    assert set_mmap_threshold(threshold)
else:  # glibc's default: one freed 4 MiB mapping raises the threshold above 2 MiB chunks
    first = b"x" * (4 << 20)
    del first
rss = lambda: psutil.Process().memory_info().rss
big, pins = [], []
for _ in range(64):
    big.append(b"\\x01" * (2 << 20))  # written: every page resident
    pins.append(b"\\x02" * (100 << 10))
before = rss()
del big
print((before - rss()) >> 20)
"""


def _freed_mib(threshold: int) -> int:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _SANDWICH, str(threshold)],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(out.stdout.strip())


def test_a_fixed_mmap_threshold_gives_big_frees_back_at_once() -> None:
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("the mmap threshold is glibc's")
    dynamic, fixed = _freed_mib(0), _freed_mib(1 << 20)
    assert dynamic < 32, f"glibc's default gave {dynamic} MiB back: the sandwich did not pin"
    assert fixed > 100, f"with the threshold fixed at 1 MiB only {fixed} of 128 MiB went back"


def test_mmap_threshold_out_of_range_is_refused() -> None:
    from runtime.memory.host_heap import MMAP_THRESHOLD_MAX, set_mmap_threshold

    assert not set_mmap_threshold(0)
    assert not set_mmap_threshold(MMAP_THRESHOLD_MAX + 1)
