"""schemathesis against the app's own /openapi.json: generated bodies (valid and invalid) for
every operation, seeded cases in both modes; no 5xx, every status and body as documented. The app
runs in-process (schemathesis' ASGI transport runs its lifespan: the real engines load), so the
cases cost no sockets. Bodies are steered to the served models with at most a few new tokens,
so the real engine answers quickly."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance
from schemathesis.python import asgi

from runtime.server import create_app
from runtime.server.wiring import build_state
from tests.runtime.server.inprocess import llama_and_bert
from tests.runtime.server.live import ADMIN_TOKEN, light_settings

# schemathesis itself draws from `random` inside its strategies (its issue, not ours)
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")

# x 2 modes x the 25 operations: over 1,000 cases (operations without parameters give fewer).
# 80 took 212 s, the suite's longest test (2,886 cases); in that run the first 30 cases of each
# operation and mode reached every status the 80 did but two (a negative /v1/messages body's
# 404, a negative /api/v1/query's 200). FASTLLM_SCHEMATHESIS_EXAMPLES=80 runs the deeper search.
EXAMPLES_PER_OPERATION = int(os.environ.get("FASTLLM_SCHEMATHESIS_EXAMPLES", "30"))
SEED = 17
MAX_NEW_TOKENS = 3
VOCAB = 512  # the demo llama's vocabulary
STRUCTURED_FIELDS: tuple[str, ...] = (
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
)
STRUCTURED_FIELDS += ("guided_choice", "guided_grammar")


def _steer(body: Any, path: str, mode: GenerationMode) -> Any:
    if not isinstance(body, dict):
        return body
    if mode == GenerationMode.POSITIVE and isinstance(body.get("model"), str):
        body["model"] = "bert" if path.endswith("/embeddings") else "llama"
    if mode == GenerationMode.POSITIVE:
        # any string is a schema-valid regex, grammar or JSON Schema, but few are valid ones (the
        # grammar engine's 400 names the field); tools, tool_choice and the one-constraint rule
        # are cross-field: tests/runtime/server/test_structured_outputs.py covers these fields
        for key in (*STRUCTURED_FIELDS, "tools", "tool_choice"):
            body.pop(key, None)
    prompt = body.get("prompt")
    batch = (
        prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], list) else [prompt]
    )
    for ids in batch:  # one prompt or a batch of them
        if isinstance(ids, list) and all(isinstance(t, int | float) for t in ids):
            ids[:] = [int(t) % VOCAB for t in ids]  # ids the demo vocabulary has
    tokens = body.get("tokens")  # /detokenize
    if isinstance(tokens, list) and all(isinstance(t, int | float) for t in tokens):
        tokens[:] = [int(t) % VOCAB for t in tokens]
    for key in ("n", "best_of"):  # up to 32 prompts x 16 sequences: keep the engine quick
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 2:
            body[key] = 2
    best_of = body.get("best_of")
    if mode == GenerationMode.POSITIVE and isinstance(best_of, int | float):
        # best_of >= n, and not above n when streamed: cross-field rules JSON Schema cannot state
        body["best_of"] = body.get("n", 1)
    limits = [body.get("max_tokens"), body.get("max_completion_tokens")]
    if path.endswith("completions") and all(value is None for value in limits):
        body["max_tokens"] = MAX_NEW_TOKENS  # not the default 16 / 256
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and value > MAX_NEW_TOKENS
        ):
            body[key] = MAX_NEW_TOKENS
    _steer_cross_field(body)
    if mode == GenerationMode.POSITIVE:  # a negative body stays as generated
        _fit_the_context(body)
    if path == "/v1/responses":
        _steer_responses(body, mode)
    return body


def _steer_responses(body: dict[str, Any], mode: GenerationMode) -> None:
    """/v1/responses: input items, tools and text.format are objects checked item by item (an
    unknown item type is a 400 naming it: tests/runtime/server/test_responses_hostile.py), and
    stored-state fields are refused (stateless); a positive body keeps to a short string input."""
    value = body.get("max_output_tokens")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > MAX_NEW_TOKENS:
        body["max_output_tokens"] = MAX_NEW_TOKENS
    if mode != GenerationMode.POSITIVE:
        return
    body.setdefault("max_output_tokens", MAX_NEW_TOKENS)
    for key in ("text", "store", "previous_response_id", "conversation", "background"):
        body.pop(key, None)
    if not isinstance(body.get("input"), str) or not body["input"]:
        body["input"] = "hi"
    body["input"] = body["input"][:200]
    if isinstance(body.get("instructions"), str):
        body["instructions"] = body["instructions"][:200]


def _steer_cross_field(body: dict[str, Any]) -> None:
    """Rules between fields (or against the vocabulary) that JSON Schema cannot state: a
    schema-valid body is made to keep them (a body that breaks them gets a 400 naming the field,
    tests/runtime/server/test_logprobs_api.py)."""
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if body.get("max_tokens") == 0 and not body.get("echo"):
        body["max_tokens"] = limit = MAX_NEW_TOKENS  # 0 only scores an echoed prompt
    numbers = (body.get("min_tokens"), limit)
    if all(isinstance(x, int | float) and not isinstance(x, bool) for x in numbers):
        body["min_tokens"] = min(body["min_tokens"], limit)
    bias = body.get("logit_bias")
    if isinstance(bias, dict):
        body["logit_bias"] = {
            str(int(k) % VOCAB) if isinstance(k, str) and k.isdigit() else k: v
            for k, v in bias.items()
        }
    if body.get("top_logprobs") is not None and "messages" in body:
        body["logprobs"] = True


def _fit_the_context(body: dict[str, Any]) -> None:
    """A chat prompt must fit the model's 2,048 tokens (a 400 naming `prompt` otherwise: a limit
    JSON Schema cannot state). Generated messages may carry long strings, text parts and tool
    calls whose arguments the template renders: a few short ones are kept."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    del messages[4:]
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            message["content"] = content[:200]
        elif isinstance(content, list):
            del content[2:]
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    part["text"] = part["text"][:200]
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            del calls[1:]
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                    function["arguments"] = function["arguments"][:200]


def _fuzz(operation: Any, mode: GenerationMode, headers: dict[str, str]) -> int:
    num_cases = 0

    @seed(SEED)
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        nonlocal num_cases
        num_cases += 1
        case.body = _steer(case.body, operation.path, mode)
        # min_util < max_util is a cross-field rule JSON Schema cannot state: a valid-looking
        # policy may rightly get a 400 there (every other check still applies)
        # likewise any string is a schema-valid `query`, but few strings are PromQL: the query
        # API may rightly answer a valid-looking one with Prometheus' 400 bad_data
        loose = ("/admin/batch-policy", "/api/v1/query", "/api/v1/query_range")
        # a tool_result must name an earlier tool_use, a forced tool one of the tools: rules
        # between blocks that JSON Schema cannot state (tests/runtime/server/test_anthropic_*)
        loose += ("/v1/messages", "/v1/messages/count_tokens")
        excluded = [positive_data_acceptance] if operation.path in loose else []
        case.call_and_validate(headers=headers, excluded_checks=excluded)

    try:
        check()
    except Unsatisfiable:  # nothing to break in an operation without parameters (GET /health)
        assert mode == GenerationMode.NEGATIVE and num_cases == 0
    return num_cases


@pytest.fixture(scope="module")
def schema(demo_model_dir: Callable[[str], Path]) -> Iterator[Any]:
    """No API keys: negative cases then test bodies, not a missing key (tested elsewhere)."""
    # the embedded evaluator on (one round at start), so the query API has a store to read
    settings = light_settings(api_keys=[], alerts_enabled=True, alerts_interval_s=3600.0)
    state = build_state(settings, make_router=llama_and_bert(demo_model_dir))
    loaded = schemathesis.openapi.from_asgi("/openapi.json", create_app(settings, state=state))
    # a refused body is rejected data too: a negative body of a thousand long messages passes
    # max_body_bytes (413), one read too slowly on a loaded machine body_read_timeout_s (408)
    rejection = loaded.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "408", "413"]
    try:
        deadline = time.monotonic() + 120
        while not state.is_ready:  # the lifespan loads the engines in the background
            assert state.load_error is None, state.load_error
            assert time.monotonic() < deadline, "the models did not load"
            time.sleep(0.05)
        yield loaded
    finally:
        asgi.shutdown_lifespans()  # stops the engines


# the agents' routes (Responses, Messages) added five operations: 212 s on an idle 2-core machine
# beside the suite's other workers, so the suite-wide 300 s would be too close
@pytest.mark.timeout(900)
def test_openapi_conformance(schema: Any) -> None:
    operations = [result.ok() for result in schema.get_all_operations()]
    paths = {op.path for op in operations}
    assert {"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/metrics"} <= paths
    num_cases = 0
    for operation in operations:
        is_admin = operation.path.startswith("/admin")
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            # a negative admin case may drop the token on purpose: then it must get a 401
            admin = is_admin and mode == GenerationMode.POSITIVE
            headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"} if admin else {}
            num_cases += _fuzz(operation, mode, headers)
    assert num_cases >= 1000
