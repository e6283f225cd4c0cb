"""n and best_of in the engine: one prefill, forked page tables, a seed stream per choice."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from runtime.engine.engine import Engine
from runtime.engine.request import RequestHandle, TokenOutput
from runtime.engine.sampling import SamplingParams
from runtime.errors import InvalidRequestError, Overloaded
from tests.runtime.engine.support import (
    RecordingSink,
    live_owners,
    make_engine,
    one_torch_thread,
    request,
)

pytestmark = pytest.mark.usefixtures(one_torch_thread.__name__)

PROMPT = list(range(5, 5 + 37))  # 37 tokens: two full pages of 16 and a partial third


def _choices(handle: RequestHandle) -> dict[int, TokenOutput]:
    """Per choice index: its tokens joined, its final output's fields."""
    tokens: dict[int, list[int]] = defaultdict(list)
    finals: dict[int, TokenOutput] = {}
    for out in handle:
        tokens[out.index].extend(out.token_ids)
        if out.is_final:
            finals[out.index] = out
    assert set(tokens) == set(finals)
    return {
        i: TokenOutput(
            request_id=f.request_id,
            token_ids=tokens[i],
            text="",
            finished_reason=f.finished_reason,
            prompt_tokens=f.prompt_tokens,
            completion_tokens=f.completion_tokens,
            index=i,
            cumulative_logprob=f.cumulative_logprob,
        )
        for i, f in finals.items()
    }


def _sampled(**kwargs: object) -> SamplingParams:
    fields: dict[str, object] = {"max_tokens": 8, "temperature": 1.0, "ignore_eos": True}
    fields.update(kwargs)
    return SamplingParams(**fields)  # type: ignore[arg-type]


@pytest.fixture
def engine(demo_model_dir: Callable[[str], Path]) -> Iterator[Engine]:
    engine, _ = make_engine(demo_model_dir("llama"), RecordingSink(), kv_block_size=16)
    yield engine
    engine.shutdown()


def test_n4_with_a_seed_is_reproducible_and_its_choices_differ(engine: Engine) -> None:
    params = _sampled(n=4, seed=1234)
    first = _choices(engine.submit(request("a", PROMPT, params)))
    again = _choices(engine.submit(request("b", PROMPT, params)))
    assert sorted(first) == [0, 1, 2, 3]
    assert [first[i].token_ids for i in range(4)] == [again[i].token_ids for i in range(4)]
    assert len({tuple(first[i].token_ids) for i in range(4)}) == 4  # temperature 1: all differ
    assert all(len(c.token_ids) == 8 == c.completion_tokens for c in first.values())


def test_choice_i_draws_the_stream_of_seed_plus_i(engine: Engine) -> None:
    """Choice i of `seed` is what a plain request with `seed + i` samples: its own stream."""
    group = _choices(engine.submit(request("g", PROMPT, _sampled(n=3, seed=50))))
    for i in range(3):
        alone = engine.submit(request(f"s{i}", PROMPT, _sampled(seed=50 + i))).result()
        assert group[i].token_ids == alone.token_ids


def test_the_prompt_pages_are_held_once_by_every_choice(
    demo_model_dir: Callable[[str], Path],
) -> None:
    engine, hooks = make_engine(demo_model_dir("llama"), RecordingSink(), kv_block_size=16)
    try:
        engine.load()
        kv_cache = engine._parts.kv_cache
        # after the prefill step (its first tokens) and before the end, look at the page tables:
        # the first forward of the four choices parks itself
        parked = hooks().hold_when(lambda seqs: len(seqs) == 4)
        handle = engine.submit(request("r", PROMPT, _sampled(n=4, seed=1, max_tokens=12)))
        outputs = iter(handle)
        seen = 0
        while seen < 4:  # each choice's first token: all four forked
            seen += next(outputs).completion_tokens == 1
        assert parked.wait(30)
        tables = [kv_cache.get(rid) for rid in ("r", "r#1", "r#2", "r#3")]
        assert all(t is not None for t in tables)
        pages = [t.page_ids for t in tables]  # type: ignore[union-attr]
        # the prompt's two full pages: the same page ids in all four tables, refcount 4
        assert all(p[:2] == pages[0][:2] for p in pages)
        assert [kv_cache.pool.refcounts[p] for p in pages[0][:2]] == [4, 4]
        # the partial third page (5 prompt tokens) is each choice's own copy
        assert len({p[2] for p in pages}) == 4
        stats = kv_cache.stats()
        assert stats.num_shared_pages == 2
        # pages in use: 2 shared + 4 own (no fifth page: 37 + 2 tokens fit in three)
        assert stats.num_used_pages == 2 + 4
        hooks().release()
        for _ in outputs:
            pass
        assert live_owners(engine) == []
        assert kv_cache.stats().num_shared_pages == 0
    finally:
        hooks().release()
        engine.shutdown()


def test_one_prefill_feeds_every_choice(demo_model_dir: Callable[[str], Path]) -> None:
    """The step that prefills the prompt is the only one with prompt tokens in it."""
    sink = RecordingSink()
    engine, _ = make_engine(demo_model_dir("llama"), sink, kv_block_size=16)
    try:
        _choices(engine.submit(request("p", PROMPT, _sampled(n=4, seed=3, max_tokens=4))))
        assert sum(s.num_prefill_tokens for s in sink.steps) == len(PROMPT)
        assert sum(s.num_sampled for s in sink.steps) == 1 + 4 * 3  # one row fed all four firsts
    finally:
        engine.shutdown()


def test_one_record_per_request_with_n_and_every_choices_tokens(
    demo_model_dir: Callable[[str], Path],
) -> None:
    sink = RecordingSink()
    engine, _ = make_engine(demo_model_dir("llama"), sink)
    try:
        _choices(engine.submit(request("rec", PROMPT, _sampled(n=3, seed=9, max_tokens=5))))
        engine.shutdown(drain_timeout_s=1.0)
        records = [r for r in sink.finished if r.request_id == "rec"]
        assert len(records) == 1
        record = records[0]
        assert (
            record.n == 3 and record.completion_tokens == 15 and record.longest_choice_tokens == 5
        )
        assert record.finished_reason == "length"
        # the three choices decode side by side: time per token divides by one choice's steps
        assert record.first_token_ts is not None and record.finished_ts is not None
        expected_tpot = (record.finished_ts - record.first_token_ts) / 4
        assert record.tpot_seconds == pytest.approx(expected_tpot)
    finally:
        engine.shutdown()


def test_best_of_ranks_by_the_models_logprob_of_the_sampled_tokens(
    engine: Engine, demo_model_dir: Callable[[str], Path]
) -> None:
    from transformers import AutoModelForCausalLM

    params = _sampled(n=1, best_of=3, seed=11, max_tokens=4)
    choices = _choices(engine.submit(request("bo", PROMPT, params)))
    assert sorted(choices) == [0, 1, 2]
    hf = AutoModelForCausalLM.from_pretrained(demo_model_dir("llama"), dtype=torch.float32).eval()
    with torch.inference_mode():
        for choice in choices.values():
            ids = torch.tensor([PROMPT + choice.token_ids])
            logprobs = hf(ids).logits[0, len(PROMPT) - 1 : -1].float().log_softmax(-1)
            expected = logprobs.gather(1, torch.tensor(choice.token_ids).unsqueeze(1)).sum()
            assert choice.cumulative_logprob == pytest.approx(float(expected), abs=1e-4)
    plain = _choices(engine.submit(request("plain", PROMPT, _sampled(n=2, seed=11))))
    assert all(c.cumulative_logprob is None for c in plain.values())  # n == best_of: not kept


def test_cancel_ends_every_choice_and_frees_their_pages(
    demo_model_dir: Callable[[str], Path],
) -> None:
    engine, hooks = make_engine(demo_model_dir("llama"), RecordingSink())
    try:
        handle = engine.submit(request("c", PROMPT, _sampled(n=4, max_tokens=200, seed=2)))
        outputs = iter(handle)
        next(outputs)
        assert engine.cancel("c")
        finals = [o for o in outputs if o.is_final]
        assert handle.finished
        assert len(finals) >= 3 and all(o.finished_reason == "cancelled" for o in finals)
        # a choice in the forward meanwhile frees its KV when the step ends: run one more
        engine.submit(request("after", [5, 6], _sampled(max_tokens=2))).result(timeout=60)
        assert live_owners(engine) == []
        assert engine.kv_cache_stats().num_used_pages == 0
    finally:
        hooks().release()
        engine.shutdown()


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [({"n": 17}, "n"), ({"n": 2, "best_of": 1}, "best_of"), ({"best_of": 0}, "best_of")],
)
def test_bad_n_and_best_of_are_typed_errors(kwargs: dict[str, int], param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert err.value.param == param


def test_admission_counts_each_choice_as_a_sequence(demo_model_dir: Callable[[str], Path]) -> None:
    sink = RecordingSink()
    engine, hooks = make_engine(
        demo_model_dir("llama"),
        sink,
        max_num_seqs=4,
        max_queued_requests=4,
    )
    try:
        engine.load()
        hooks().hold()
        one = engine.submit(request("one", PROMPT[:10], _sampled(max_tokens=20)))
        assert hooks().entered.wait(5)  # "one" is in the forward; the queue is empty
        four = engine.submit(request("four", PROMPT, _sampled(n=4, max_tokens=3, seed=5)))
        assert engine.num_waiting == 4  # the gauge's count: each choice a sequence
        with pytest.raises(Overloaded):  # four queued sequences + two more > 4
            engine.submit(request("two", PROMPT, _sampled(n=2, max_tokens=3)))
        engine.submit(request("solo", PROMPT, _sampled(max_tokens=3))).cancel()  # 4 + 1 > 4?
    except Overloaded:
        pass  # "solo" refused too: the queue holds four sequences
    else:
        raise AssertionError("a fifth queued sequence was admitted")
    finally:
        hooks().release()
    try:
        one.result(timeout=60)
        assert sorted(_choices(four)) == [0, 1, 2, 3]
        for step in sink.steps:  # a batch past the limit is only ever one request's choices
            if step.num_seqs > step.batch_size_limit:
                assert len({rid.split("#")[0] for rid in step.request_ids}) == 1
            assert step.num_running <= max(4, step.batch_size_limit)
    finally:
        engine.shutdown()


def test_a_choice_with_no_page_for_its_fork_recomputes_and_samples_the_same(
    demo_model_dir: Callable[[str], Path],
) -> None:
    params = _sampled(n=3, seed=77, max_tokens=6)
    roomy, _ = make_engine(demo_model_dir("llama"), kv_block_size=16)
    try:
        expected = _choices(roomy.submit(request("r", PROMPT, params)))
        page_bytes = roomy._parts.kv_cache.bytes_per_page
    finally:
        roomy.shutdown()
    sink = RecordingSink()
    tight, _ = make_engine(
        demo_model_dir("llama"),
        sink,
        kv_block_size=16,
        kv_cache_bytes=5 * page_bytes,  # the zero page + 4: the prompt's 3 and one fork's copy
    )
    try:
        got = _choices(tight.submit(request("r", PROMPT, params)))
        assert [got[i].token_ids for i in range(3)] == [expected[i].token_ids for i in range(3)]
        # two choices were queued and recomputed their prompt's tail (the full pages were cached)
        assert sum(s.num_prefill_tokens for s in sink.steps) > len(PROMPT)
        assert live_owners(tight) == []
    finally:
        tight.shutdown()


def test_choices_through_a_replica_set_match_one_engine(
    demo_model_dir: Callable[[str], Path],
) -> None:
    """A ReplicaSet hands the engine's n-choice handle through (sync and async consumers)."""
    import asyncio

    from runtime.serving.replicas import ReplicaSet

    model_dir = demo_model_dir("llama")
    params = _sampled(n=3, seed=8, max_tokens=4)
    single, _ = make_engine(model_dir)
    try:
        expected = _choices(single.submit(request("x", PROMPT, params)))
    finally:
        single.shutdown()
    engines = [make_engine(model_dir)[0] for _ in range(2)]
    replicas = ReplicaSet(engines, sink=RecordingSink())
    replicas.load()
    replicas.start()
    try:
        got = _choices(replicas.submit(request("x", PROMPT, params)))

        async def consume() -> dict[int, list[int]]:
            tokens: dict[int, list[int]] = defaultdict(list)
            async for outputs in replicas.submit(request("y", PROMPT, params)).batches():
                for out in outputs:
                    tokens[out.index].extend(out.token_ids)
            return dict(tokens)

        streamed = asyncio.run(consume())
    finally:
        replicas.shutdown(drain_timeout_s=30.0)
    assert {i: c.token_ids for i, c in got.items()} == {i: c.token_ids for i, c in expected.items()}
    assert streamed == {i: c.token_ids for i, c in expected.items()}
