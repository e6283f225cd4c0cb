"""Constraints through the HTTP API under hostile input (issue 39): a compile past its budget is
a 400 for its request alone while another client's constrained request completes; bounds, `$ref`,
lookarounds, unsatisfiable schemas and tool schemas get one answer, a 400 naming the field, on
every route and under every tool_choice; the cache's event counter moves."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.engine.constraints.limits import GrammarLimits
from tests.runtime.server.live import (
    API_KEY,
    LiveServer,
    engine_for,
    light_settings,
    live_server,
    router_of,
)

OTHER_KEY = "sk-other-tenant"
# the regex length cap raised past the default 4,096 for the attack alone: 3,000 dots compiled in
# 0.83-1.03 s here, right at the budget (a 200 instead of the 400 once); 12,000 take ~4x it
LIMITS = GrammarLimits(
    compile_timeout_s=1.0, num_workers=2, cache_max_bytes=400_000, max_regex_chars=12_000
)
RULES = "".join(f'r{i} ::= "x" r{i + 1}\n' for i in range(1100)) + 'r1100 ::= "y"'
ATTACK = "." * 12_000  # seconds to compile on this vocabulary: well past the 1 s budget


@pytest.fixture(scope="module")
def server(demo_model_dir: Callable[[str], Path]) -> Iterator[LiveServer]:
    make_router = router_of(
        llama=partial(engine_for, demo_model_dir("llama"), name="llama", grammar=LIMITS)
    )
    settings = light_settings(api_keys=[API_KEY, OTHER_KEY])
    with live_server(settings, make_router) as live:
        yield live


def post(server: LiveServer, body: dict[str, Any], key: str = API_KEY) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "llama", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        | body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )


def refusal(response: httpx.Response) -> tuple[str, str]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    return error["param"], error["message"]


def events(server: LiveServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics").text
    found = re.findall(r'fastllm_grammar_cache_events_total\{[^}]*event="(\w+)"[^}]*\} (\S+)', text)
    return {event: float(value) for event, value in found}


def moved(server: LiveServer, before: dict[str, float], event: str) -> bool:
    """Whether `event` counted past `before` (the sinks record a request after its response:
    wait for it a little)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if events(server).get(event, 0.0) > before.get(event, 0.0):
            return True
        time.sleep(0.05)
    return False


def test_a_compile_past_its_budget_is_a_400_and_others_are_served_meanwhile(server) -> None:
    post(server, {"guided_regex": "warm"})  # the workers are up
    with ThreadPoolExecutor(2) as pool:
        t0 = time.monotonic()
        attack = pool.submit(post, server, {"guided_regex": ATTACK})
        time.sleep(0.2)
        other = post(server, {"guided_regex": "(yes|no)"}, key=OTHER_KEY)
        other_done = time.monotonic() - t0
        assert other.status_code == 200 and other.json()["choices"][0]["message"]["content"] in {
            "yes",
            "no",
        }
        param, message = refusal(attack.result(60))
        attack_done = time.monotonic() - t0
    assert param == "guided_regex" and "grammar_compile_timeout_s" in message
    assert other_done < attack_done  # served while the attack's compile ran
    assert moved(server, {}, "timeout")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"guided_regex": "a" * (LIMITS.max_regex_chars + 1)}, "guided_regex"),
        ({"guided_grammar": "root ::= r0\n" + RULES}, "guided_grammar"),
        (
            {"guided_json": {"type": "object", "properties": {f"p{i}": {} for i in range(1100)}}},
            "guided_json",
        ),
    ],
)
def test_a_constraint_past_its_size_bound_is_a_400_naming_its_field(server, body, param) -> None:
    found, message = refusal(post(server, body))
    assert found == param and "grammar_max_" in message


def test_the_same_grammar_within_the_bound_compiles(server) -> None:
    few = "root ::= r0\n" + "".join(f'r{i} ::= "x" r{i + 1}\n' for i in range(20)) + 'r20 ::= "y"'
    assert post(server, {"guided_grammar": few}).status_code == 200


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}


@pytest.mark.parametrize("ref", ["http://127.0.0.1:9/s.json", "file:///etc/passwd"])
def test_a_ref_to_a_url_is_a_400(server, ref: str) -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": ref}}, "required": ["a"]}
    param, message = refusal(post(server, schema_format(schema)))
    assert param == "response_format" and "local" in message


def test_a_lookahead_gets_one_answer_in_a_regex_and_in_a_schema_pattern(server) -> None:
    _, direct = refusal(post(server, {"guided_regex": "(?=a)a"}))
    param, in_schema = refusal(post(server, schema_format({"type": "string", "pattern": "(?=a)a"})))
    reason = direct.split("refused it: ")[1]
    assert param == "response_format" and reason in in_schema


def test_an_unsatisfiable_schema_is_a_400(server) -> None:
    schema = {"allOf": [{"type": "string"}, {"type": "integer"}]}
    param, message = refusal(post(server, schema_format(schema)))
    assert param == "response_format" and "no value satisfies" in message


@pytest.mark.parametrize("tool_choice", ["auto", "none", "required", None])
def test_an_invalid_tool_schema_is_a_400_under_every_tool_choice(server, tool_choice) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]
    body: dict[str, Any] = {"tools": tools}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    assert refusal(post(server, body))[0] == "tools"


def test_cache_events_count_hits_and_evictions(server) -> None:
    before = events(server)
    body = schema_format({"type": "object", "properties": {"k": {"type": "boolean"}}})
    assert post(server, body).status_code == 200
    assert post(server, body).status_code == 200
    assert moved(server, before, "hit") and moved(server, before, "miss")
    before = events(server)
    big = post(server, {"guided_regex": "." * 400})  # alone past the 400 kB bound
    assert big.status_code == 200
    assert moved(server, before, "evict")
