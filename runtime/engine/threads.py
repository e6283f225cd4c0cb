"""Intra-op threads for the threads that run model ops.

OpenMP's thread count is a per-thread setting: `torch.set_num_threads` called on the main thread
does not reach a thread that is already running (the engine loop, the verifier), so each of those
applies the configured count itself when it starts (`apply_num_threads`). 0 means the physical
cores: on a 2-core machine with hyper-threads the logical count would oversubscribe. Within that
count, `StepThreads` runs each step on one thread or on all of them, whichever measured faster
for steps of its size.
"""

from __future__ import annotations

import ctypes
import functools
import os
import statistics
from typing import TYPE_CHECKING

import psutil
import torch

from runtime.errors import ConfigError

if TYPE_CHECKING:
    from runtime.models.loader import LoadedModel


def resolve_num_threads(num_threads: int) -> int:
    """The count to use: `num_threads`, or the physical cores when it is 0."""
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 0:
        raise ConfigError(
            "num_threads must be an integer >= 0 (0: physical cores)", param="num_threads"
        )
    if num_threads:
        return num_threads
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def apply_num_threads(num_threads: int) -> int:
    """Set the calling thread's intra-op thread count; returns what torch now reports."""
    torch.set_num_threads(resolve_num_threads(num_threads))
    return torch.get_num_threads()


# GNU OpenMP (torch's Linux wheels), looked up among the libraries already loaded. Only there
# does a pause release just the calling thread's pool; LLVM's and Intel's runtimes pause every
# thread of the process, which could land while the engine's loop is inside a region.
_LIBGOMP = "libgomp.so.1"
_OMP_PAUSE_SOFT = 1  # omp_pause_soft of omp_pause_resource_t


@functools.cache
def _openmp() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(_LIBGOMP, mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LAZY)
    except OSError:  # another OpenMP runtime, or none: nothing is released
        return None
    return lib if hasattr(lib, "omp_pause_resource_all") else None


def release_openmp_workers() -> bool:
    """Let the calling thread's OpenMP worker threads go (libgomp's `omp_pause_resource_all`,
    OpenMP 5.0; a later parallel region on this thread makes them again). True where it did.

    Why: OpenMP's workers belong to the thread that ran the parallel region, and libgomp keeps
    a worker spinning between regions (a region then starts in ~1 us) only while the process
    holds no more OpenMP threads than CPUs; past that every region ends in a futex sleep and
    starts with a wake-up. The model is loaded, measured and warmed up on the caller's thread,
    then decoded on the engine's: the loader's idle workers alone tipped a 2-core machine over.
    Measured there (SmolLM2-135M int4, batch-1 decode at 2 threads, median of 96 steps, three
    rounds): 11.1-12.4 ms a step on a second thread while the first thread's workers lived,
    8.9-9.4 once they were let go, 9.2-10.6 on the first thread itself."""
    lib = _openmp()
    return lib is not None and lib.omp_pause_resource_all(_OMP_PAUSE_SOFT) == 0


# steps of a settled size class before it is measured again (StepThreads): RECHECK_FIRST after
# it settles or changes its count, twice as many after each measurement that confirms it, up to
# RECHECK_EVERY
RECHECK_FIRST = 256
RECHECK_EVERY = 4096


def _size_class(num_tokens: int) -> int:
    """Steps are compared within powers of two of their token count."""
    return 1 << max(num_tokens - 1, 0).bit_length()


class StepThreads:
    """The intra-op thread count each CPU step runs with: `num_threads` is the most it uses.

    Measured on a 2-core CPU (SmolLM2-135M, int4): a batch-1 decode step ran at 52 tok/s on one
    thread and 35 on two (~240 small ops a token, each paying OpenMP's fork and join), while a
    batch-8 step ran at 143 on one and 169 on two. Which count wins depends on the model, the
    CPU and the step's size, so it is measured, not guessed: the first steps of each size class
    (powers of two of the step's tokens) alternate between one thread and the most, `trials`
    timed steps each after a cold one, and the class then keeps the count that the median of
    the paired ratios (the k-th step on the most over the k-th on one, run one after the other)
    favours. Alternating and pairing make a drift or a shift (a growing context, other load,
    the warm-up's steps then real ones) hit both alike. A class above one that settled on the
    most threads takes the most without measuring (more work per step splits better).
    A settled class is measured again after `recheck_first` of its steps, then after twice as
    many each time the count is confirmed, up to `recheck_every`: a measurement may run while
    something else holds the cores (another process loading, the server's own HTTP thread and
    a client on a 2-core machine), and a wrong count would otherwise stand for thousands of
    steps. Seen in bench.peer --server: of two identical servers, one kept one thread for
    batch-1 decode after pairs of 46 ms (one thread) against 125-150 ms (two) in its first
    steps, and served 16 ms a token against 11.7 ms for the other. Measuring costs a few steps
    on the slower count: under 1% of a class's steps at the first interval, ~0.1% at the last.
    Off (the count never changes) when the most is one, or for a CUDA device, whose steps do not
    run on these threads. A reduction split across another number of threads can round
    differently, so while a class is measuring, two identical requests may differ in the last
    bits of their logits (as they may in batches of different shapes); greedy tokens agree
    unless two logits tie within that rounding."""

    def __init__(
        self,
        max_threads: int,
        *,
        enabled: bool = True,
        trials: int = 5,
        recheck_first: int = RECHECK_FIRST,
        recheck_every: int = RECHECK_EVERY,
    ) -> None:
        self.max_threads = max_threads
        self.trials = trials  # 5: the median of three pairs followed one slow step
        self.recheck_first = min(recheck_first, recheck_every)
        self.recheck_every = recheck_every
        self.candidates = (1, max_threads) if enabled and max_threads > 1 else (max_threads,)
        self.choice: dict[int, int] = {}  # size class -> the count it settled on
        self._seconds: dict[tuple[int, int], list[float]] = {}  # (class, count) -> step times
        self._since: dict[int, int] = {}  # size class -> its steps since it settled
        self._interval: dict[int, int] = {}  # size class -> its steps between measurements
        self._last: dict[int, int] = {}  # size class -> the count its last measurement chose

    def pick(self, num_tokens: int) -> int:
        """The count for a step of `num_tokens` tokens, applied to the calling thread."""
        if len(self.candidates) == 1:
            return self.candidates[0]
        size = _size_class(num_tokens)
        threads = self.choice.get(size)
        if threads is None and any(
            c < size and t == self.max_threads for c, t in self.choice.items()
        ):
            # a smaller class already runs faster on the most: a bigger step has more work to
            # split, so it does too. Measuring it anyway cost bench.serving's first burst ~0.6 s
            # (four 1024-token prefills on one thread, 330 ms each against 180 on two)
            threads = self.choice[size] = self.max_threads
        if threads is None:  # still measuring: the candidate with fewer steps (ties: one thread)
            threads = min(self.candidates, key=lambda c: len(self._seconds.get((size, c), ())))
        if torch.get_num_threads() != threads:  # ~0.1 us; OpenMP keeps its pool
            torch.set_num_threads(threads)
        return threads

    def recheck_within(self, steps: int) -> None:
        """Measure every settled class again after at most `steps` more of its steps, and drop
        the times of the classes still measuring (the engine's loop, for the warm-up's choices
        and times: taken on the loading thread, while whatever else ran on the machine then).

        Why the times go too: a class the warm-up left unsettled went on from them in the
        loop, comparing the warm-up's steps with the first real ones. Two identical servers
        started one after the other (bench.peer --server) settled batch-1 decode on one thread
        in one of them (pairs 16.9 / 21.8 and 13.3 / 16.9 ms) and on two in the other; served,
        16 ms a token against 11.7, for the life of the class's choice."""
        for size in self.choice:
            self._since[size] = max(self._since.get(size, 0), self._every(size) - steps)
        for key in [k for k in self._seconds if k[0] not in self.choice]:
            del self._seconds[key]

    def observe(self, num_tokens: int, threads: int, seconds: float) -> None:
        """A step's measured time; settles its size class once every candidate has enough."""
        size = _size_class(num_tokens)
        if len(self.candidates) == 1:
            return
        if size in self.choice:
            since = self._since.get(size, 0) + 1
            self._since[size] = since
            if since >= self._every(size):  # measured again from the next step (class doc)
                del self.choice[size]
                self._since[size] = 0
                for count in self.candidates:
                    self._seconds.pop((size, count), None)
            return
        self._seconds.setdefault((size, threads), []).append(seconds)
        one, most = (self._seconds.get((size, c), [])[1:] for c in self.candidates)  # [0]: cold
        if len(one) >= self.trials and len(most) >= self.trials:
            # the steps alternate, so the k-th of each ran side by side: compare them in pairs.
            # Medians of each count apart were fooled by a shift in the steps' shapes within a
            # class (the warm-up sweep's short contexts, then real ones): at 32 decode rows of
            # the `small` llama they kept one thread (41 ms a step against 27 on two)
            ratios = [b / a for a, b in zip(one, most, strict=False) if a > 0]
            faster = bool(ratios) and statistics.median(ratios) < 1.0
            chosen = self.candidates[1] if faster else self.candidates[0]
            confirmed = self._last.get(size) == chosen
            self._interval[size] = (
                min(2 * self._every(size), self.recheck_every) if confirmed else self.recheck_first
            )
            self._last[size] = self.choice[size] = chosen

    def _every(self, size: int) -> int:
        """Steps of a settled class between its measurements (class doc)."""
        return self._interval.get(size, self.recheck_first)


def step_threads_for(
    current: StepThreads | None, loaded: LoadedModel, compiled: bool = False
) -> StepThreads:
    """The per-step thread policy for the calling thread's count (another if it differs: the
    warm-up may run on another thread than the loop), kept with the model's weights; a compiled
    step's (`compiled`) apart from the eager forward's."""
    most = torch.get_num_threads()
    if current is not None and current.max_threads == most:
        return current
    kept = loaded.step_threads
    key: int | tuple[int, str] = (most, "compiled") if compiled else most
    if key not in kept:
        kept[key] = StepThreads(most, enabled=torch.device(loaded.device).type == "cpu")
    return kept[key]
