"""Structured output on the tiny random llama: the mask, not the model, makes every constrained
output parse (checked with `jsonschema` and `re`, neither written here), in batches mixed with
unconstrained rows, with sampling at temperature 1, and across preemption."""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import pytest

from runtime.engine.constraints import ConstraintSpec
from runtime.engine.constraints.cache import GrammarCache
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.errors import InvalidRequestError
from tests.runtime.engine.support import RecordingSink, make_engine, one_torch_thread

pytestmark = pytest.mark.usefixtures(one_torch_thread.__name__)

# each one's grammar ends within the token bound: bounded strings, numbers, arrays
SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {
                "type": "object",
                "properties": {"w": {"type": "integer", "minimum": 1, "maximum": 9}},
                "required": ["w"],
                "additionalProperties": False,
            },
        },
        "required": ["color", "size"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
            "ok": {"type": "boolean"},
        },
        "required": ["tags", "ok"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {"type": "integer", "minimum": -5, "maximum": 5},
        "minItems": 1,
        "maxItems": 4,
    },
]
REGEX = r"[a-c]{2,4}-\d{1,3}"
CHOICES = ["yes", "no", "maybe so"]


def sampled(max_tokens: int, seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed)


def constrained_requests(prompt: list[int], seed: int = 0) -> list[GenerationRequest]:
    out = [
        GenerationRequest(
            f"json{i}",
            prompt,
            sampled(160, seed + i),
            constraint=ConstraintSpec.json_schema(s, "response_format"),
        )
        for i, s in enumerate(SCHEMAS)
    ]
    out.append(
        GenerationRequest(
            "regex",
            prompt,
            sampled(40, seed + 10),
            constraint=ConstraintSpec("regex", REGEX, "guided_regex"),
        )
    )
    out.append(
        GenerationRequest(
            "choice",
            prompt,
            sampled(40, seed + 11),
            constraint=ConstraintSpec.choice(CHOICES, "guided_choice"),
        )
    )
    return out


def check(rid: str, text: str) -> None:
    if rid.startswith("json"):
        jsonschema.validate(json.loads(text), SCHEMAS[int(rid[4:])])
    elif rid == "regex":
        assert re.fullmatch(REGEX, text), text
    else:
        assert text in CHOICES, text


def run_mixed(engine, prompt: list[int], seed: int) -> dict[str, str]:
    reqs = constrained_requests(prompt, seed)
    plain = [
        GenerationRequest(
            f"plain{i}", prompt, SamplingParams(max_tokens=24, seed=i, ignore_eos=True)
        )
        for i in range(len(reqs))
    ]
    # interleaved: constrained and unconstrained rows side by side in every step
    handles = {
        r.request_id: engine.submit(r) for pair in zip(reqs, plain, strict=True) for r in pair
    }
    results = {rid: h.result(timeout=120) for rid, h in handles.items()}
    for rid, out in results.items():
        if rid.startswith("plain"):
            assert out.finished_reason == "length" and out.completion_tokens == 24
        else:
            assert out.finished_reason == "stop", (rid, out.text)
            check(rid, out.text)
    return {rid: out.text for rid, out in results.items()}


def test_constrained_rows_parse_in_a_batch_mixed_with_unconstrained(demo_model_dir) -> None:
    sink = RecordingSink()
    engine, _ = make_engine(demo_model_dir("llama"), sink, batch_warmup=False)
    try:
        for seed in (0, 100):
            run_mixed(engine, [1, 5, 9, 30], seed)
        assert max(s.num_seqs for s in sink.steps) > 6  # they really shared steps
    finally:
        engine.shutdown(drain_timeout_s=10)
    stats = sink.by_id()
    assert stats["json0"].constraint == "json" and stats["regex"].constraint == "regex"
    assert stats["choice"].constraint == "choice" and stats["plain0"].constraint == "none"
    assert not any(r.grammar_incomplete for r in stats.values())
    grammars = engine._parts.grammars
    assert grammars is not None
    cache = grammars.stats()
    assert cache.num_misses == 6 and cache.num_hits == 6  # the second round hit every grammar


def test_constrained_outputs_parse_across_preemption(demo_model_dir) -> None:
    page_bytes = 2 * 2 * 2 * 16 * 4 * 16  # tiny llama: 2 layers, K+V, 2 kv heads x 16, fp32
    engine, _ = make_engine(
        demo_model_dir("llama"),
        kv_cache_bytes=14 * page_bytes,
        batch_warmup=False,
        initial_num_seqs=16,
        min_num_seqs=16,
    )
    try:
        # the grammars compiled first, in a short round: left to compile during the round
        # below, the constrained rows can join late, and since stop 55 (its thread choices, not
        # its attention kernel: kernels off failed too) the budget held every row in most runs,
        # leaving no preemption to test
        run_mixed(engine, [3], seed=0)
        before = engine.kv_cache_stats().num_preemptions
        run_mixed(engine, list(range(3, 23)), seed=7)
        preempted = engine.kv_cache_stats().num_preemptions - before
        assert preempted > 0, "the budget should force preemption"
    finally:
        engine.shutdown(drain_timeout_s=10)


def test_an_output_cut_by_max_tokens_is_reported_incomplete(demo_model_dir) -> None:
    sink = RecordingSink()
    engine, _ = make_engine(demo_model_dir("llama"), sink, batch_warmup=False)
    spec = ConstraintSpec.json_schema(
        {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]},
        "guided_json",
    )
    try:
        out = engine.submit(
            GenerationRequest("cut", [1, 2, 3], sampled(3, 0), constraint=spec)
        ).result(timeout=60)
    finally:
        engine.shutdown(drain_timeout_s=10)
    assert out.finished_reason == "length" and out.text.startswith('{"s')
    record = sink.by_id()["cut"]
    assert record.grammar_incomplete and record.constraint == "json"
    assert record.grammar_cache_hit is False and record.grammar_compile_seconds is not None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (ConstraintSpec.json_schema({"type": "nonsense"}, "response_format"), "nonsense"),
        (ConstraintSpec("regex", "(ab", "guided_regex"), "parenthesis"),
        (ConstraintSpec("grammar", "root ::= undefined_rule", "guided_grammar"), "undefined"),
    ],
)
def test_a_constraint_the_engine_refuses_is_a_400_naming_the_field(
    demo_model_dir, spec: ConstraintSpec, message: str
) -> None:
    engine, _ = make_engine(demo_model_dir("llama"), batch_warmup=False)
    try:
        with pytest.raises(InvalidRequestError) as err:
            engine.submit(GenerationRequest("bad", [1, 2], sampled(4, 0), constraint=spec))
    finally:
        engine.shutdown()
    assert err.value.param == spec.param and err.value.http_status == 400
    assert spec.param in err.value.message and message in err.value.message.lower()


def test_a_slow_compile_does_not_hold_other_requests(demo_model_dir) -> None:
    """Order of events: the plain request finishes while the constrained one's compile is held;
    the constrained one then runs and parses."""
    engine, _ = make_engine(demo_model_dir("llama"), batch_warmup=False)
    engine.load()
    gate, events = threading.Event(), []
    parts = engine._parts
    assert parts.grammars is not None

    def slow(compiler, grammar):
        events.append("compile started")
        gate.wait(60)
        events.append("compile done")
        return compiler.compile_grammar(grammar)

    parts.grammars = GrammarCache(parts.grammars.info, compile_fn=slow)
    try:
        slow_handle = engine.submit(
            GenerationRequest(
                "slow", [1, 2], sampled(40, 0), constraint=ConstraintSpec.choice(CHOICES, "x")
            )
        )
        plain = engine.submit(GenerationRequest("plain", [1, 2], sampled(8, 1)))
        plain.result(timeout=60)
        events.append("plain finished")
        assert not slow_handle.finished
        gate.set()
        out = slow_handle.result(timeout=60)
        events.append("slow finished")
    finally:
        gate.set()
        engine.shutdown(drain_timeout_s=10)
    assert events == ["compile started", "plain finished", "compile done", "slow finished"]
    assert out.text in CHOICES
