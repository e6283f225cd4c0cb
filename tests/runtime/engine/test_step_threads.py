"""StepThreads: each size class of steps measures one thread against the most, alternating, and
keeps the faster; the count is set on the calling thread (OpenMP's is per thread)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from runtime.engine.threads import StepThreads


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def settle(policy: StepThreads, num_tokens: int, seconds: dict[int, float]) -> list[int]:
    """Steps of `num_tokens` until a class settles; each takes `seconds[count]`."""
    picked: list[int] = []
    settled = len(policy.choice)
    for _ in range(20):
        threads = policy.pick(num_tokens)
        picked.append(threads)
        assert torch.get_num_threads() == threads  # applied, not only returned
        policy.observe(num_tokens, threads, seconds[threads])
        if len(policy.choice) > settled:
            break
    return picked


@pytest.mark.usefixtures("two_threads")
def test_each_size_class_keeps_the_faster_count() -> None:
    policy = StepThreads(2, trials=3)
    # batch 1: one thread is faster (what a 2-core CPU measured for SmolLM2 int4)
    picked = settle(policy, 1, {1: 0.020, 2: 0.030})
    assert picked == [1, 2] * 4  # alternating, a cold step and three timed ones each
    assert policy.choice == {1: 1}
    assert [policy.pick(1) for _ in range(3)] == [1, 1, 1]
    # batch 8 (class 8): two threads are faster; 5..8 tokens share the class
    for _ in range(8):
        threads = policy.pick(5)
        policy.observe(7, threads, {1: 0.050, 2: 0.040}[threads])
    assert policy.choice == {1: 1, 8: 2}
    assert policy.pick(6) == 2 == torch.get_num_threads()
    # a bigger class follows class 8 at once: no step of 1024 tokens runs on one thread
    assert policy.pick(1000) == 2 and policy.choice[1024] == 2
    assert not any(key[0] == 1024 for key in policy._seconds)
    # a class between two is measured when only the smaller one kept one thread
    assert policy.pick(2) == 1 and 2 not in policy.choice


@pytest.mark.usefixtures("two_threads")
def test_the_median_decides_and_the_cold_step_is_not_counted() -> None:
    policy = StepThreads(2, trials=3)
    # one thread: a very slow cold step, then fast; two threads: one outlier among fast steps
    times = {1: iter([9.0, 0.010, 0.010, 0.010]), 2: iter([0.012, 0.012, 5.0, 0.012])}
    for _ in range(8):
        threads = policy.pick(3)
        policy.observe(3, threads, next(times[threads]))
    assert policy.choice == {4: 1}


def test_one_thread_or_a_cuda_device_never_changes_the_count() -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert StepThreads(1).pick(1) == 1
        torch.set_num_threads(2)
        off = StepThreads(2, enabled=False)
        for _ in range(10):
            assert off.pick(1) == 2
            off.observe(1, 2, 0.01)
        assert off.choice == {} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_engine_loop_runs_small_steps_on_the_count_it_measured(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Through a real engine (num_threads 2): the policy is kept on the loaded model, every class
    the steps touched is measured on both counts, and the loop's own count stays the most."""
    from runtime.engine.offline import generate
    from runtime.engine.sampling import SamplingParams
    from runtime.models.loader import load_model
    from tests.runtime.models.builders import build_llama

    loaded = load_model(build_llama(tmp_path_factory.mktemp("threads") / "llama"), device="cpu")
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    caller = threading.get_ident()
    generate(loaded, [[5, 6, 7]], params, num_threads=2)
    assert threading.get_ident() == caller
    policy = loaded.step_threads[2]
    assert policy.choice.get(1) in (1, 2)  # batch-1 decode settled on one of the two
    timed = {key for key, seconds in policy._seconds.items() if key[0] == 1}
    assert timed == {(1, 1), (1, 2)}
    # a second engine on the same weights starts from what the first measured, and its loop
    # measures those choices again within 64 steps (24 steps here: not yet)
    generate(loaded, [[5, 6, 7]], params, num_threads=2)
    assert loaded.step_threads[2] is policy
    assert policy.choice.get(1) in (1, 2)
    assert policy._since[1] >= policy._every(1) - 64


@pytest.mark.usefixtures("two_threads")
def test_a_shift_in_the_steps_mid_measurement_does_not_pick_the_slower_count() -> None:
    """Two threads are 0.7x one thread's time throughout, but from the sixth step on every step
    costs twice as much (the warm-up's short contexts, then real ones): one pair straddles the
    shift; separate medians would compare one thread's early steps with two threads' late ones
    and keep one thread."""
    policy = StepThreads(2, trials=3)
    picked = []
    for step in range(8):
        threads = policy.pick(20)
        picked.append(threads)
        base = 0.020 if step < 5 else 0.040
        policy.observe(20, threads, base * (1.0 if threads == 1 else 0.7))
    assert picked == [1, 2] * 4
    assert policy.choice == {32: 2}


_RELEASE_SCRIPT = """
import json, threading, time
import psutil, torch
from runtime.engine.threads import _openmp, release_openmp_workers

process, counts = psutil.Process(), {}

def settled():  # the workers start and exit asynchronously
    for _ in range(100):
        now = process.num_threads()
        time.sleep(0.01)
        if process.num_threads() == now:
            return now
    return process.num_threads()

big = torch.ones(1 << 22)  # made here: filling it is a parallel region of this thread's own

def run():
    torch.set_num_threads(3)
    counts["before"] = settled()
    big.exp()  # an elementwise op this long splits over every thread: the workers start
    counts["with"] = settled()
    counts["released"] = int(release_openmp_workers())
    counts["after"] = settled()
    big.exp()
    counts["again"] = settled()

if _openmp() is not None:
    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
print(json.dumps(counts))
"""


def test_a_thread_lets_its_openmp_workers_go() -> None:
    """A thread that ran a parallel region on 3 threads holds 2 OpenMP workers; released, the
    process has them no more (they exit), and the next region makes them again. In a process
    of its own: a test worker's other threads come and go."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _RELEASE_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    if not counts:
        pytest.skip("torch's OpenMP runtime here is not libgomp with omp_pause_resource_all")
    assert counts["released"] == 1
    assert counts["with"] == counts["before"] + 2
    assert counts["after"] == counts["before"]
    assert counts["again"] == counts["with"]


def test_starting_the_engine_loop_releases_the_starting_threads_workers(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The model is loaded and measured on the caller's thread, decoded on the loop's: the
    caller's OpenMP workers are let go when the loop starts, on the caller's thread."""
    from runtime.engine import core
    from runtime.engine.offline import generate
    from runtime.engine.sampling import SamplingParams
    from runtime.models.loader import load_model
    from tests.runtime.models.builders import build_llama

    released: list[int] = []
    monkeypatch.setattr(
        core, "release_openmp_workers", lambda: released.append(threading.get_ident())
    )
    loaded = load_model(build_llama(tmp_path_factory.mktemp("release") / "llama"), device="cpu")
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    generate(loaded, [[5, 6, 7]], params, num_threads=2)
    assert released == [threading.get_ident()]


def test_an_engine_loaded_on_one_thread_releases_that_threads_workers(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The server loads on a worker thread and starts the engine from its event loop's: the
    loading thread lets its own workers go when the load ends (the start's release runs on
    another thread and could not)."""
    from dataclasses import replace

    from runtime.engine import core, engine
    from runtime.engine.offline import _offline_config
    from runtime.engine.sampling import SamplingParams
    from runtime.models.loader import load_model
    from tests.runtime.models.builders import build_llama

    released: list[tuple[str, int]] = []
    for module in (core, engine):
        name = module.__name__.rsplit(".", 1)[-1]
        monkeypatch.setattr(
            module,
            "release_openmp_workers",
            lambda name=name: released.append((name, threading.get_ident())),
        )
    loaded = load_model(build_llama(tmp_path_factory.mktemp("load-thread") / "llama"), device="cpu")
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    config = replace(_offline_config(loaded, [[5, 6, 7]], params), num_threads=2)
    server_engine = engine.Engine(config, loader=lambda: loaded)
    loader = threading.Thread(target=server_engine.load)
    loader.start()
    loader.join()
    try:
        server_engine.start()
        assert released == [("engine", loader.ident), ("core", threading.get_ident())]
    finally:
        server_engine.shutdown()


@pytest.mark.usefixtures("two_threads")
def test_a_settled_class_is_measured_again_and_follows_the_machine() -> None:
    """A choice made while another process loaded on the same cores does not stand for good:
    after `recheck_every` steps the class alternates again and settles on what now runs
    faster; the other classes keep theirs meanwhile."""
    policy = StepThreads(2, trials=3, recheck_every=10)
    settle(policy, 1, {1: 0.010, 2: 0.030})  # at load, two threads looked slow
    settle(policy, 8, {1: 0.050, 2: 0.040})
    assert policy.choice == {1: 1, 8: 2}
    for _ in range(9):
        assert policy.pick(1) == 1
        policy.observe(1, 1, 0.010)
    assert policy.choice == {1: 1, 8: 2}
    policy.observe(1, 1, 0.010)  # the 10th step since it settled
    assert policy.choice == {8: 2}
    picked = settle(policy, 1, {1: 0.015, 2: 0.009})  # the other process has gone
    assert picked == [1, 2] * 4
    assert policy.choice == {1: 2, 8: 2}


@pytest.mark.usefixtures("two_threads")
def test_the_warm_ups_choices_are_measured_again_soon() -> None:
    """`recheck_within(n)`: a class settled at warm-up is measured again after at most n more
    of its steps (the engine's loop calls it when it starts), never later than it would be."""
    policy = StepThreads(2, trials=3, recheck_every=4096)
    settle(policy, 1, {1: 0.010, 2: 0.030})
    policy.recheck_within(5)
    for _ in range(4):
        policy.observe(1, policy.pick(1), 0.010)
    assert policy.choice == {1: 1}
    policy.observe(1, policy.pick(1), 0.010)
    assert policy.choice == {}


@pytest.mark.usefixtures("two_threads")
def test_the_loop_drops_the_warm_ups_times_of_a_class_still_measuring() -> None:
    """A class the warm-up left unsettled starts measuring afresh when the loop calls
    `recheck_within`: its warm-up times (two threads slow then) are not paired with the loop's
    (two threads fast now), and a settled class keeps its choice until its recheck."""
    policy = StepThreads(2, trials=3)
    settle(policy, 8, {1: 0.050, 2: 0.040})  # settled at warm-up: kept
    for _ in range(3):  # class 1: a cold step and one timed step each, not settled
        policy.observe(1, policy.pick(1), {1: 0.010, 2: 0.030}[torch.get_num_threads()])
    assert 1 not in policy.choice
    policy.recheck_within(64)
    assert policy.choice == {8: 2}
    picked = settle(policy, 1, {1: 0.015, 2: 0.009})
    assert picked == [1, 2] * 4  # measured from a cold step again
    assert policy.choice == {1: 2, 8: 2}


@pytest.mark.usefixtures("two_threads")
def test_a_confirmed_count_is_measured_again_less_often_and_a_change_soon() -> None:
    """After it settles a class is measured again within `recheck_first` steps; each
    measurement that confirms the count doubles the interval up to `recheck_every`, and one
    that changes it starts over."""
    policy = StepThreads(2, trials=3, recheck_first=4, recheck_every=16)
    timings = {1: 0.010, 2: 0.030}
    intervals = []
    for _ in range(5):
        settle(policy, 1, timings)
        assert policy.choice == {1: 1}
        steps = 0
        while 1 in policy.choice:
            policy.observe(1, policy.pick(1), timings[1])
            steps += 1
        intervals.append(steps)
    assert intervals == [4, 8, 16, 16, 16]
    settle(policy, 1, {1: 0.015, 2: 0.009})  # two threads now win: soon measured again
    assert policy.choice == {1: 2} and policy._every(1) == 4
