"""The `priority` field of completions, chat, responses and messages bodies (vLLM's: lower runs
first) reaches the engine request, the API key's default (api_key_priorities) standing in when
the body has none; a bad value is the API's own 400. The engine echoes the priority it ran with
in the request's timings (enable_request_metrics)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.server.inprocess import AUTH, InProcess, in_process, llama_and_bert
from tests.runtime.server.live import light_settings

CHAT = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BODIES: dict[str, dict[str, Any]] = {
    "/v1/completions": {"model": "llama", "prompt": "Hello", "max_tokens": 2},
    "/v1/chat/completions": CHAT,
    "/v1/responses": {"model": "llama", "input": "hi", "max_output_tokens": 2},
    "/v1/messages": CHAT,
}


@pytest.fixture(scope="module")
def app(demo_model_dir: Callable[[str], Path]) -> Iterator[InProcess]:
    settings = light_settings(
        enable_request_metrics=True, scheduling_policy="priority", api_key_priorities=[3]
    )
    with in_process(settings, llama_and_bert(demo_model_dir)) as app:
        yield app


@pytest.mark.parametrize("path", list(BODIES))
def test_the_bodys_priority_else_the_keys_reaches_the_engine(app: InProcess, path: str) -> None:
    # 5.0: JSON Schema's integer too (schemathesis sent 6015471.0 and got a 400 once)
    for sent, expected in ((None, 3), (-7, -7), (0, 0), (5.0, 5)):
        body = dict(BODIES[path]) if sent is None else {**BODIES[path], "priority": sent}
        response = app.client.post(path, json=body, headers=AUTH)
        assert response.status_code == 200, response.text
        assert response.json()["metrics"]["priority"] == expected


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("bad", ["high", 1.5, True, 1 << 40, None])
def test_a_bad_priority_is_the_apis_own_400(app: InProcess, path: str, bad: object) -> None:
    response = app.client.post(path, json={**BODIES[path], "priority": bad}, headers=AUTH)
    if bad is None:  # null: the default
        assert response.status_code == 200
        return
    assert response.status_code == 400, response.text
    body = response.json()
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        assert "priority" in (body["error"].get("param") or body["error"]["message"])


def test_the_settings_parse_a_comma_list_of_key_priorities() -> None:
    assert light_settings(api_key_priorities="2, -1").api_key_priorities == [2, -1]
    assert light_settings(api_key_priorities="[4]").api_key_priorities == [4]


def test_the_environment_sets_key_priorities(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTLLM_API_KEY_PRIORITIES", "1,5")
    assert light_settings().api_key_priorities == [1, 5]
    monkeypatch.setenv("FASTLLM_API_KEY_PRIORITIES", "x")
    with pytest.raises(ValueError, match="api_key_priorities"):
        light_settings()
