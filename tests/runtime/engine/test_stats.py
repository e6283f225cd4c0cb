"""What the engine hands to its sink, asyncio streaming with cancel, and embeddings."""

from __future__ import annotations

import asyncio

import pytest
import torch

from runtime.engine.stats import RequestEvent
from runtime.errors import InvalidRequestError
from tests.runtime.engine.support import (
    RecordingSink,
    greedy,
    live_owners,
    make_engine,
    one_torch_thread,
    request,
)

pytestmark = pytest.mark.usefixtures(one_torch_thread.__name__)


@pytest.mark.timeout(120)
def test_request_and_step_stats(demo_model_dir) -> None:
    sink = RecordingSink()
    engine, _ = make_engine(demo_model_dir("llama"), sink)
    handles = [
        engine.submit(request(f"s{i}", [5, 6, 7, 8][: i + 1], greedy(3 + i), version="canary"))
        for i in range(3)
    ]
    for h in handles:
        h.result(timeout=60)
    engine.shutdown(drain_timeout_s=10)
    stats = sink.by_id()
    for i in range(3):
        r = stats[f"s{i}"]
        assert (r.model, r.version, r.finished_reason, r.failure_reason) == (
            "tiny",
            "canary",
            "length",
            None,
        )
        assert (r.prompt_tokens, r.completion_tokens, r.max_tokens) == (i + 1, 3 + i, 3 + i)
        names = [event for event, _ in r.events]
        assert names == [
            RequestEvent.QUEUED,
            RequestEvent.SCHEDULED,
            RequestEvent.FIRST_TOKEN,
            RequestEvent.FINISHED,
        ]
        times = [ts for _, ts in r.events]
        assert times == sorted(times)
        assert (r.queued_ts, r.scheduled_ts, r.first_token_ts, r.finished_ts) == tuple(times)
        assert r.batch_size >= 1
    served = [rid for step in sink.steps for rid in step.request_ids]
    assert {rid: served.count(rid) for rid in stats} == {
        "s0": 3,
        "s1": 4,
        "s2": 5,
    }  # 1 prefill + decodes
    last = sink.steps[-1]
    assert (last.num_running, last.num_waiting, last.model) == (0, 0, "tiny")
    assert all(s.busy_seconds > 0 and s.batch_size_limit >= 1 for s in sink.steps)
    assert sum(s.num_decode_tokens for s in sink.steps) == (3 + 4 + 5) - 3
    assert sum(s.num_sampled for s in sink.steps) == 3 + 4 + 5  # one row per generated token


@pytest.mark.timeout(120)
def test_async_stream_then_cancel_frees_kv(demo_model_dir) -> None:
    sink = RecordingSink()
    engine, _ = make_engine(demo_model_dir("llama"), sink)

    async def run() -> list:
        handle = await engine.asubmit(request("a1", [5, 6, 7], greedy(1000)))
        seen = []
        async for out in handle:
            seen.append(out)
            if len(seen) == 2:
                assert engine.cancel("a1")
        return seen

    seen = asyncio.run(run())
    assert seen[-1].finished_reason == "cancelled" and not engine.cancel("a1")
    engine.shutdown(drain_timeout_s=10)
    assert live_owners(engine) == []
    record = sink.by_id()["a1"]
    assert record.finished_reason == "cancelled" and record.events[-1][0] is RequestEvent.CANCELLED


@pytest.mark.timeout(120)
def test_embed_batches_like_one_at_a_time(demo_model_dir) -> None:
    sink = RecordingSink()
    engine, _ = make_engine(demo_model_dir("bert"), sink)
    texts = ["hello world", "a much longer sentence about the engine and its batches", "x"]
    result = engine.embed(texts)
    singles = [engine.embed([t]).embeddings[0] for t in texts]
    assert result.prompt_tokens == [len(engine.tokenizer.encode(t)) for t in texts]
    got, want = torch.tensor(result.embeddings), torch.tensor(singles)
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(got.norm(dim=1), torch.ones(3), atol=1e-5)
    with pytest.raises(InvalidRequestError):
        engine.submit(request("g", [5, 6], greedy(2)))  # an encoder cannot generate
    assert [r.operation for r in sink.finished] == ["embeddings"] * 4
    engine.shutdown()


@pytest.mark.timeout(120)
def test_embed_on_a_causal_lm_is_an_invalid_request(demo_model_dir) -> None:
    engine, _ = make_engine(demo_model_dir("llama"))
    with pytest.raises(InvalidRequestError) as err:
        engine.embed(["hi"])
    assert err.value.param == "model"
    engine.shutdown()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("interval_s", [1e-9, 0.0])
def test_engine_loop_trims_the_heap_when_enabled(demo_model_dir, interval_s: float) -> None:
    engine, _ = make_engine(demo_model_dir("llama"), heap_trim_interval_s=interval_s)
    handles = [engine.submit(request(f"t{i}", [5, 6, 7], greedy(4))) for i in range(3)]
    assert [h.result(timeout=60).completion_tokens for h in handles] == [4, 4, 4]
    trims = engine._parts.core.trimmer.num_trims
    engine.shutdown(drain_timeout_s=10)
    assert (trims > 0) == (interval_s > 0)


@pytest.mark.timeout(120)
def test_engine_fixes_the_mmap_threshold_only_when_asked(
    demo_model_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.engine import core

    calls: list[int] = []
    monkeypatch.setattr(core, "set_mmap_threshold", lambda n: calls.append(n) is None)
    for threshold in (0, 1 << 20):
        engine, _ = make_engine(demo_model_dir("llama"), heap_mmap_threshold_bytes=threshold)
        engine.submit(request("m", [5, 6], greedy(1))).result(timeout=60)  # the core is built
        engine.shutdown()
    assert calls == [1 << 20]  # 0 leaves glibc's dynamic threshold alone
