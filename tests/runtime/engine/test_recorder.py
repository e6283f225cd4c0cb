"""The stats recorder (runtime.engine.recorder): sinks run on its thread, a step's final outputs
reach their handles only after the sink recorded that step, a full queue drops stats (counted)
but never an output, and an engine's request is seen finished only with its record in."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from runtime.engine.recorder import StatsRecorder
from runtime.engine.request import GenerationRequest, RequestHandle, TokenOutput
from runtime.engine.sampling import SamplingParams
from runtime.engine.stats import FinishReason, RequestStats, StepStats, VerificationResult
from tests.runtime.engine.support import RecordingSink, make_engine, one_torch_thread


class GatedSink:
    """Records which thread called it; waits on `gate` before returning."""

    def __init__(self, *, fail: bool = False) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.calls: list[tuple[str, list[str]]] = []
        self.fail = fail

    def record(
        self,
        step: StepStats | None = None,
        finished: Sequence[RequestStats] = (),
        verified: Sequence[VerificationResult] = (),
    ) -> None:
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        self.calls.append((threading.current_thread().name, [r.request_id for r in finished]))
        if self.fail:
            raise RuntimeError("a broken sink")


def final(handle: RequestHandle) -> tuple[RequestHandle, TokenOutput]:
    return handle, TokenOutput(handle.request_id, [], "", FinishReason.STOP, 1, 0)


def record(rid: str) -> RequestStats:
    return RequestStats(request_id=rid, model="m")


def test_outputs_reach_their_handles_only_after_the_sink_recorded_their_step() -> None:
    sink = GatedSink()
    recorder = StatsRecorder(sink)
    handle = RequestHandle("r1")
    recorder.submit(None, [record("r1")], [final(handle)])
    assert sink.entered.wait(30)
    assert not handle.finished  # the sink has not returned yet
    sink.gate.set()
    assert recorder.flush(30)
    assert handle.finished
    assert sink.calls == [("fastllm-stats", ["r1"])]  # off the submitting thread
    recorder.close()


def test_a_full_queue_drops_stats_counted_but_never_an_output() -> None:
    sink = GatedSink()
    recorder = StatsRecorder(sink, max_queued=1)
    handles = [RequestHandle(f"r{i}") for i in range(3)]
    recorder.submit(None, [record("r0")], [final(handles[0])])
    assert sink.entered.wait(30)  # the thread holds r0; the queue has room for one more
    recorder.submit(None, [record("r1")], [final(handles[1])])
    recorder.submit(None, [record("r2")], [final(handles[2])])  # no room: dropped
    assert recorder.num_dropped == 1 and handles[2].finished  # its output went out at once
    sink.gate.set()
    recorder.close()
    assert all(h.finished for h in handles)
    assert [ids for _, ids in sink.calls] == [["r0"], ["r1"]]


def test_a_sink_that_raises_is_counted_and_the_outputs_still_go_out() -> None:
    sink = GatedSink(fail=True)
    sink.gate.set()
    recorder = StatsRecorder(sink)
    handle = RequestHandle("r1")
    recorder.submit(None, [record("r1")], [final(handle)])
    assert recorder.flush(30)
    assert handle.finished and recorder.num_sink_errors == 1
    recorder.close()
    after = RequestHandle("late")
    recorder.submit(None, [record("late")], [final(after)])  # closed: pushed, counted
    assert after.finished and recorder.num_dropped == 1


@pytest.mark.usefixtures(one_torch_thread.__name__)
def test_a_finished_request_is_seen_with_its_record_and_steps_in(
    demo_model_dir: Callable[[str], Path],
) -> None:
    sink = RecordingSink()
    engine, _ = make_engine(demo_model_dir("llama"), sink)
    try:
        for i in range(4):
            params = SamplingParams(max_tokens=3 + i, temperature=0.0, ignore_eos=True)
            out = engine.submit(GenerationRequest(f"q{i}", [5, 6, 7], params)).result(timeout=60)
            assert out.completion_tokens == 3 + i
            # no wait: the end of the stream came after the sink had the request's numbers
            assert sink.by_id()[f"q{i}"].completion_tokens == 3 + i
            served = [rid for step in sink.steps for rid in step.request_ids]
            assert served.count(f"q{i}") == 3 + i  # its prefill step, then a step per decode
    finally:
        engine.shutdown()


def _step(step_id: int) -> StepStats:
    return StepStats(
        ts=1.0,
        step_id=step_id,
        num_seqs=1,
        num_prefill_tokens=0,
        num_decode_tokens=1,
        busy_seconds=0.01,
        num_running=1,
        num_waiting=0,
        batch_size_limit=16,
    )


def test_prepare_runs_on_the_recorder_thread_and_the_sink_records_what_it_returns() -> None:
    sink = RecordingSink()
    seen: list[tuple[str, int, bool]] = []

    def prepare(step: StepStats, failed: bool) -> StepStats:
        seen.append((threading.current_thread().name, step.step_id, failed))
        if step.step_id == 3:
            raise RuntimeError("a broken hook")
        return StepStats(**{**vars(step), "num_waiting": 7})

    recorder = StatsRecorder(sink, prepare=prepare)
    recorder.submit(_step(1))
    recorder.submit(_step(2), failed=True)
    recorder.submit(_step(3))  # the hook raises: the step is recorded as submitted, counted
    recorder.submit(None, [record("r1")])  # no step: no hook
    assert recorder.flush(30)
    recorder.close()
    assert seen == [
        ("fastllm-stats", 1, False),
        ("fastllm-stats", 2, True),
        ("fastllm-stats", 3, False),
    ]
    assert [(s.step_id, s.num_waiting) for s in sink.steps] == [(1, 7), (2, 7), (3, 0)]
    assert recorder.num_sink_errors == 1 and [r.request_id for r in sink.finished] == ["r1"]


@pytest.mark.usefixtures(one_torch_thread.__name__)
def test_the_batch_policy_and_the_allocator_report_follow_every_step_off_the_loop(
    demo_model_dir: Callable[[str], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a sink, the controller's step-time model, the busy tracker and the allocator's figures
    are fed on the recorder's thread, before the step's outputs go out: a finished request's
    steps are all in them."""
    sink = RecordingSink()
    engine, _ = make_engine(demo_model_dir("llama"), sink, batch_warmup=False)
    try:
        engine.load()
        controller = engine._parts.controller
        observed: list[tuple[str, tuple[str, ...]]] = []
        observe = controller.observe

        def spy(step: StepStats) -> None:
            observed.append((threading.current_thread().name, step.request_ids))
            observe(step)

        monkeypatch.setattr(controller, "observe", spy)
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        engine.submit(GenerationRequest("q", [5, 6, 7], params)).result(timeout=60)
        # no wait: the end of the stream came after its last step was observed
        assert observed == [("fastllm-stats", ("q",))] * 4
        served = [s for s in sink.steps if "q" in s.request_ids]
        assert len(served) == 4 and all(s.allocator is not None for s in served)
        assert engine.busy_fraction() is not None
    finally:
        engine.shutdown()
