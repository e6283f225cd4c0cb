"""runtime.verify's Verifier without a model: `verify_jobs` is replaced by a fake that records
the batches it gets, so the worker's own guarantees are checked directly and fast: which
finished sequences become jobs, the bounded queue and its drop hook, batching by model, flush and
close (what is left is dropped and counted), and sampling by request id."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from runtime.config import load_settings
from runtime.engine.stats import VerificationResult
from runtime.verify import verifier as verify
from runtime.verify.jobs import VerifyJob
from runtime.verify.verifier import Verifier, is_sampled


class Sink:
    def __init__(self) -> None:
        self.verified: list[VerificationResult] = []

    def record(self, step: Any = None, finished: Any = (), verified: Any = ()) -> None:
        self.verified.extend(verified)


@dataclass
class FakeReference:
    """Stands in for verify_jobs: one result per job; can hold the worker until released."""

    batches: list[list[str]] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)

    def __call__(self, jobs: list[VerifyJob]) -> list[VerificationResult]:
        self.entered.set()
        assert self.gate.wait(30), "the test never released the fake reference"
        self.batches.append([j.request_id for j in jobs])
        return [
            VerificationResult(j.request_id, j.model_name, j.version, "logit", 1.0, 1.0, 0.0)
            for j in jobs
        ]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeReference:
    ref = FakeReference()
    monkeypatch.setattr(verify, "verify_jobs", ref)
    return ref


MODEL_A, MODEL_B = object(), object()


def job(rid: str, model: object = MODEL_A, dtype: torch.dtype = torch.float32) -> VerifyJob:
    return VerifyJob(rid, "m", "stable", model, dtype, (1, 2), 3, 0.5)  # type: ignore[arg-type]


def sequence(**overrides: Any) -> Any:
    fields: dict[str, Any] = {
        "request_id": "r1",
        "is_verified": True,
        "chosen_logit": 0.25,
        "prompt_token_ids": [5, 6],
        "output_token_ids": [7, 8, 9],
        "stats": SimpleNamespace(model="tiny", version="canary", finished_reason="stop"),
    }
    fields.update(overrides)
    return SimpleNamespace(**fields)


def test_a_finished_sequence_becomes_a_job_of_what_its_last_step_saw() -> None:
    verifier = Verifier(sample_rate=1.0, autostart=False)
    model = torch.nn.Linear(1, 1)
    assert verifier.submit_sequence(sequence(), model, torch.float16) is True
    queued = verifier._queue.get_nowait()
    assert queued == VerifyJob(
        request_id="r1",
        model_name="tiny",
        version="canary",
        model=model,  # type: ignore[arg-type]
        dtype=torch.float16,
        token_ids=(5, 6, 7, 8),  # prompt + outputs but the last
        chosen_token_id=9,
        chosen_logit=0.25,
    )
    assert verifier.num_submitted == 1


@pytest.mark.parametrize(
    "overrides",
    [
        {"is_verified": False},
        {"chosen_logit": None},
        {"output_token_ids": []},
        {"stats": SimpleNamespace(model="m", version="v", finished_reason="cancelled")},
        {"stats": SimpleNamespace(model="m", version="v", finished_reason=None)},
        {"stats": None},  # a broken sequence: logged, never raised into the engine
    ],
)
def test_sequences_that_are_not_verified(overrides: dict[str, Any]) -> None:
    verifier = Verifier(sample_rate=1.0, autostart=False)
    seq = sequence(**overrides)
    assert verifier.submit_sequence(seq, torch.nn.Linear(1, 1), torch.float32) is False
    assert verifier.num_submitted == 0 and verifier._queue.empty()


def test_length_finished_sequences_are_verified_too() -> None:
    verifier = Verifier(sample_rate=1.0, autostart=False)
    seq = sequence(stats=SimpleNamespace(model="m", version="v", finished_reason="length"))
    assert verifier.submit_sequence(seq, torch.nn.Linear(1, 1), torch.float32) is True


def test_a_full_queue_drops_counts_and_calls_the_hook_which_may_fail() -> None:
    calls: list[int] = []

    def on_drop(n: int) -> None:
        calls.append(n)
        raise RuntimeError("metrics hook broke")  # must not reach the engine

    verifier = Verifier(sample_rate=1.0, queue_size=2, on_drop=on_drop, autostart=False)
    assert [verifier.submit(job(f"r{i}")) for i in range(4)] == [True, True, False, False]
    assert (verifier.num_submitted, verifier.num_dropped, calls) == (2, 2, [1, 1])


def test_jobs_are_verified_in_batches_of_one_model_and_dtype(fake: FakeReference) -> None:
    sink = Sink()
    verifier = Verifier(sink, sample_rate=1.0, max_batch=3, autostart=False)
    jobs = [job("a1"), job("b1", MODEL_B), job("a2"), job("h1", dtype=torch.float16)]
    jobs += [job("a3"), job("a4")]
    for j in jobs:
        assert verifier.submit(j)
    fake.gate.set()
    verifier.start()
    assert verifier.flush(timeout=30)
    # the first take holds at most max_batch=3 jobs: a1, b1, a2 -> {a1, a2} and {b1}; then the
    # rest: h1 (another dtype), a3 + a4
    assert fake.batches == [["a1", "a2"], ["b1"], ["h1"], ["a3", "a4"]]
    assert (verifier.num_done, verifier.num_verified, verifier.num_failed) == (6, 6, 0)
    assert sorted(r.request_id for r in sink.verified) == sorted(j.request_id for j in jobs)
    assert verifier.busy_seconds > 0 and verifier.cpu_seconds >= 0
    assert verifier.close(timeout=5) is True
    assert not verifier._thread.is_alive()


def test_a_failing_sink_counts_the_batch_as_failed(fake: FakeReference) -> None:
    class Broken:
        def record(self, **_: Any) -> None:
            raise RuntimeError("sink broke")

    fake.gate.set()
    with Verifier(Broken(), sample_rate=1.0) as verifier:  # type: ignore[arg-type]
        verifier.submit(job("r1"))
        assert verifier.flush(timeout=30)
        assert (verifier.num_failed, verifier.num_verified, verifier.num_done) == (1, 0, 1)
        verifier.submit(job("r2"))  # a second failed batch adds up
        assert verifier.flush(timeout=30)
        assert (verifier.num_failed, verifier.num_verified, verifier.num_done) == (2, 0, 2)
    assert not verifier._thread.is_alive()  # the context manager closed it


def test_flush_times_out_while_the_worker_is_busy(fake: FakeReference) -> None:
    verifier = Verifier(Sink(), sample_rate=1.0)
    verifier.submit(job("r1"))
    assert fake.entered.wait(30)
    assert verifier.flush(timeout=0.2) is False
    fake.gate.set()
    assert verifier.flush(timeout=30) is True
    verifier.close()


def test_flush_waits_out_a_timeout_under_one_second(fake: FakeReference) -> None:
    """A short timeout is waited for, not refused up front. The job is released the moment
    flush first waits, so only flush's own bookkeeping decides the outcome."""
    verifier = Verifier(Sink(), sample_rate=1.0)
    verifier.submit(job("r1"))
    assert fake.entered.wait(30)
    wait = verifier._lock.wait

    def release_then_wait(timeout: float | None = None) -> bool:
        fake.gate.set()
        return wait(timeout)

    verifier._lock.wait = release_then_wait  # type: ignore[method-assign]
    try:
        assert verifier.flush(timeout=0.99) is True
    finally:
        fake.gate.set()
        verifier.close()


def test_flush_without_a_timeout_waits_until_done(fake: FakeReference) -> None:
    verifier = Verifier(Sink(), sample_rate=1.0)
    verifier.submit(job("r1"))
    assert fake.entered.wait(30)
    threading.Timer(0.05, fake.gate.set).start()
    assert verifier.flush() is True  # no deadline: polls until the worker is done
    assert verifier.num_done == 1
    verifier.close()


def test_a_batch_cut_short_by_the_sentinel_is_still_returned() -> None:
    """The worker may be collecting a batch while close() queues the sentinel: the jobs it
    already took are verified, and the sentinel goes back for the loop to end on."""
    verifier = Verifier(sample_rate=1.0, autostart=False)
    for rid in ("r0", "r1"):
        verifier._queue.put_nowait(job(rid))
    verifier._queue.put_nowait(None)
    assert [j.request_id for j in verifier._take()] == ["r0", "r1"]
    assert verifier._take() == []  # the sentinel, put back


def test_flush_without_a_worker_returns_false_at_once() -> None:
    verifier = Verifier(sample_rate=1.0, autostart=False)
    assert verifier.flush() is True  # nothing submitted
    verifier.submit(job("r1"))
    assert verifier.flush() is False  # the worker never started: it cannot get there


def test_close_drops_and_counts_what_the_worker_did_not_get_to(fake: FakeReference) -> None:
    verifier = Verifier(Sink(), sample_rate=1.0, max_batch=1)
    for i in range(4):
        verifier.submit(job(f"r{i}"))
    assert fake.entered.wait(30)  # the worker holds r0; r1..r3 wait in the queue
    assert verifier.close(timeout=0.1) is False  # not all done within the timeout
    assert verifier.num_dropped == 3  # r1..r3; the sentinel behind them stops the worker
    fake.gate.set()
    verifier._thread.join(30)
    assert fake.batches == [["r0"]] and not verifier._thread.is_alive()
    assert verifier.submit(job("late")) is False and verifier.num_dropped == 4
    verifier.start()  # a closed verifier never starts again
    assert not verifier._thread.is_alive()


def test_close_finishes_what_is_queued_before_it_stops(fake: FakeReference) -> None:
    verifier = Verifier(Sink(), sample_rate=1.0, max_batch=1)
    for i in range(3):
        verifier.submit(job(f"r{i}"))
    assert fake.entered.wait(30)  # the worker holds r0; r1, r2 wait in the queue
    threading.Timer(0.05, fake.gate.set).start()
    assert verifier.close(timeout=30) is True  # waited for them, dropped nothing
    assert verifier.num_dropped == 0
    assert fake.batches == [["r0"], ["r1"], ["r2"]]


def test_drops_at_close_add_to_earlier_drops() -> None:
    verifier = Verifier(sample_rate=1.0, queue_size=2, autostart=False)
    assert [verifier.submit(job(f"r{i}")) for i in range(3)] == [True, True, False]
    assert verifier.num_dropped == 1  # the full queue refused r2
    assert verifier.close() is False
    assert verifier.num_dropped == 3  # r0 and r1, never verified, on top


def test_close_of_a_never_started_verifier_reports_whether_the_queue_was_empty() -> None:
    assert Verifier(sample_rate=1.0, autostart=False).close() is True
    verifier = Verifier(sample_rate=1.0, autostart=False)
    verifier.submit(job("r1"))
    assert verifier.close() is False and verifier.num_dropped == 1


def test_from_settings() -> None:
    settings = load_settings(verify_sample_rate=0.25, verify_queue_size=7)
    sink = Sink()
    verifier = Verifier.from_settings(settings, sink, autostart=False)  # type: ignore[arg-type]
    assert (verifier.sample_rate, verifier._queue.maxsize, verifier.sink) == (0.25, 7, sink)
    assert not verifier._thread.is_alive()
    started = Verifier.from_settings(settings)
    assert started._thread.is_alive()
    started.close()


def test_defaults_are_the_settings_defaults_and_the_worker_never_blocks_exit() -> None:
    verifier = Verifier(autostart=False)
    settings = load_settings()
    assert verifier.sample_rate == settings.verify_sample_rate
    assert verifier._queue.maxsize == settings.verify_queue_size
    # a daemon, named for thread dumps: a verifier nobody closed must not hold the process
    assert verifier._thread.daemon and verifier._thread.name == "fastllm-verify"


def test_sampling_by_request_id_follows_the_rate() -> None:
    ids = [f"chatcmpl-{i}" for i in range(4000)]
    half = [i for i in ids if is_sampled(i, 0.5)]
    assert 1800 <= len(half) <= 2200  # binomial(4000, 0.5): sd 32
    quarter = {i for i in ids if is_sampled(i, 0.25)}
    assert quarter <= set(half)  # one hash, compared with the rate: nested sets
    assert all(is_sampled(i, 1.5) for i in ids[:50]) and not any(is_sampled(i, -1) for i in ids)
    verifier = Verifier(sample_rate=0.5, autostart=False)
    assert [verifier.should_verify(i) for i in ids[:200]] == [i in half for i in ids[:200]]


def test_busy_and_cpu_seconds_add_up_over_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark counters accumulate: a CPU-heavy batch then a light one. (Only invariants
    are asserted: sums never shrink and never exceed what the worker thread can have used.)"""
    thread_cpu_after: list[float] = []

    def reference(jobs: list[VerifyJob]) -> list[VerificationResult]:
        if jobs[0].request_id == "heavy":
            start = time.thread_time()
            while time.thread_time() - start < 0.2:  # burn CPU in the worker thread
                pass
        thread_cpu_after.append(time.thread_time())
        return []

    monkeypatch.setattr(verify, "verify_jobs", reference)
    wall_start = time.perf_counter()
    verifier = Verifier(Sink(), sample_rate=1.0)
    verifier.submit(job("heavy"))
    assert verifier.flush(timeout=30)
    busy_1, cpu_1 = verifier.busy_seconds, verifier.cpu_seconds
    verifier.submit(job("light"))
    assert verifier.flush(timeout=30)
    verifier.close()
    wall = time.perf_counter() - wall_start
    assert 0 < busy_1 <= verifier.busy_seconds <= wall
    assert 0 < cpu_1 <= verifier.cpu_seconds <= thread_cpu_after[-1]
