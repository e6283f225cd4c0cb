"""schemathesis against the live server's own /openapi.json: generated bodies (valid and invalid)
for every operation; no 5xx, every status and body as documented. Bodies are steered to the
served models with at most a few new tokens, so the real engine answers quickly."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from tests.runtime.server.live import ADMIN_TOKEN, API_KEY, LiveServer

# schemathesis itself draws from `random` inside its strategies (its issue, not ours)
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")

EXAMPLES_PER_OPERATION = 30  # x 2 modes x 9 operations: a few hundred cases
MAX_NEW_TOKENS = 3
VOCAB = 512  # the demo llama's vocabulary


def _steer(body: Any, path: str) -> Any:
    if not isinstance(body, dict):
        return body
    if isinstance(body.get("model"), str):
        body["model"] = "bert" if path.endswith("/embeddings") else "llama"
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and all(isinstance(t, int | float) for t in prompt):
        prompt[:] = [int(t) % VOCAB for t in prompt]  # ids the demo vocabulary has
    if path.endswith("completions") and "max_tokens" not in body:
        body.setdefault("max_completion_tokens", MAX_NEW_TOKENS)  # not the default 16 / 256
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 3:
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
        case.body = _steer(case.body, operation.path)
        case.call_and_validate(base_url=url, headers=headers)

    check()
    return num_cases


def test_openapi_conformance(served: LiveServer) -> None:
    schema = schemathesis.openapi.from_url(f"{served.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    paths = {op.path for op in operations}
    assert {"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/metrics"} <= paths
    num_cases = 0
    for operation in operations:
        token = ADMIN_TOKEN if operation.path.startswith("/admin") else API_KEY
        headers = {"Authorization": f"Bearer {token}"}
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            num_cases += _fuzz(operation, mode, served.url, headers)
    assert num_cases >= 200
