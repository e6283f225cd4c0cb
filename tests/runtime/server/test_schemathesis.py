"""schemathesis against the live server's own /openapi.json: generated bodies (valid and invalid)
for every operation; no 5xx, every status and body as documented. Bodies are steered to the
served models with at most a few new tokens, so the real engine answers quickly."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

from tests.runtime.server.live import (
    ADMIN_TOKEN,
    LiveServer,
    engine_for,
    light_settings,
    live_server,
    router_of,
)

# schemathesis itself draws from `random` inside its strategies (its issue, not ours)
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")

EXAMPLES_PER_OPERATION = 30  # x 2 modes x 9 operations: a few hundred cases
MAX_NEW_TOKENS = 3
VOCAB = 512  # the demo llama's vocabulary


def _steer(body: Any, path: str, mode: GenerationMode) -> Any:
    if not isinstance(body, dict):
        return body
    if mode == GenerationMode.POSITIVE and isinstance(body.get("model"), str):
        body["model"] = "bert" if path.endswith("/embeddings") else "llama"
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and all(isinstance(t, int | float) for t in prompt):
        prompt[:] = [int(t) % VOCAB for t in prompt]  # ids the demo vocabulary has
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
    return body


def _fuzz(operation: Any, mode: GenerationMode, url: str, headers: dict[str, str]) -> int:
    num_cases = 0

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
        excluded = [positive_data_acceptance] if operation.path in loose else []
        case.call_and_validate(base_url=url, headers=headers, excluded_checks=excluded)

    try:
        check()
    except Unsatisfiable:  # nothing to break in an operation without parameters (GET /health)
        assert mode == GenerationMode.NEGATIVE and num_cases == 0
    return num_cases


@pytest.fixture(scope="module")
def open_server(demo_model_dir: Callable[[str], Path]) -> Iterator[LiveServer]:
    """No API keys: negative cases then test bodies, not a missing key (tested elsewhere)."""
    make_router = router_of(
        llama=partial(engine_for, demo_model_dir("llama"), name="llama"),
        bert=partial(engine_for, demo_model_dir("bert"), name="bert"),
    )
    # the embedded evaluator on (one round at start), so the query API has a store to read
    settings = light_settings(api_keys=[], alerts_enabled=True, alerts_interval_s=3600.0)
    with live_server(settings, make_router) as server:
        yield server


def test_openapi_conformance(open_server: LiveServer) -> None:
    served = open_server
    schema = schemathesis.openapi.from_url(f"{served.url}/openapi.json")
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
            num_cases += _fuzz(operation, mode, served.url, headers)
    assert num_cases >= 200
