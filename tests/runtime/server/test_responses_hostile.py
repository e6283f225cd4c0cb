"""Hostile and unsupported bodies on /v1/responses: each is a 4xx in OpenAI's error shape, never
a 500, and the server keeps answering; the `openai` SDK raises its typed error for them."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.runtime.server.live import API_KEY, LiveServer

FUNCTION = {"type": "function", "name": "f", "parameters": {"type": "object"}}


def _post(served: LiveServer, body: Any, **headers: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {API_KEY}", **headers}
    return httpx.post(f"{served.url}/v1/responses", json=body, headers=headers, timeout=60)


def _body(**fields: Any) -> dict[str, Any]:
    return {"model": "llama", "input": "hi", "max_output_tokens": 2, **fields}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi"}, "model"),
        (_body(input=5), "input"),
        (_body(input=[5]), "input"),
        (_body(input=[{"type": "computer_call", "id": "x"}]), "input"),
        (_body(input=[{"type": "item_reference", "id": "msg_1"}]), "input"),
        (
            _body(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
            "input",
        ),
        (_body(input=[{"role": "robot", "content": "hi"}]), "input"),
        (_body(input=[{"role": "user", "content": 7}]), "input"),
        (_body(input=[{"type": "function_call", "call_id": "c", "name": "f"}]), "input"),
        (
            _body(input=[{"type": "function_call_output", "call_id": "nope", "output": "x"}]),
            "input",
        ),
        (_body(input=[]), "input"),
        (_body(input=[{"type": "reasoning", "summary": []}]), "input"),
        (_body(max_output_tokens="5"), "max_output_tokens"),
        (_body(max_output_tokens=0), "max_output_tokens"),
        (_body(max_output_tokens=10**12), "max_output_tokens"),
        (_body(temperature=3), "temperature"),
        (_body(top_logprobs=50), "top_logprobs"),
        (_body(tools=[FUNCTION] * 10_000), "tools"),
        (_body(tools={"type": "function"}), "tools"),
        (_body(tools=[{"type": "function", "name": "bad name!"}]), "tools"),
        (_body(tools=[{"type": "function", "name": "f", "parameters": "x"}]), "tools"),
        (_body(tools=[FUNCTION, FUNCTION]), "tools"),
        (_body(tools=[FUNCTION], tool_choice={"type": "function", "name": "g"}), "tool_choice"),
        (_body(tool_choice={"type": "mcp", "server_label": "x"}), "tool_choice"),
        (_body(tool_choice="required"), "tool_choice"),
        (_body(text={"format": {"type": "json_schema", "name": "x"}}), "text"),
        (_body(text={"format": {"type": "xml"}}), "text"),
        (_body(store=True), "store"),
        (_body(previous_response_id="resp_1"), "previous_response_id"),
        (_body(conversation="conv_1"), "conversation"),
        (_body(background=True), "background"),
        (_body(metadata={"k": 1}), "metadata"),
        (_body(stream="yes"), "stream"),
        (_body(input="word " * 5000), "input"),  # longer than the model's context
    ],
)
def test_bad_bodies_are_400s_naming_the_field(
    served: LiveServer, body: dict[str, Any], param: str
) -> None:
    reply = _post(served, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert error["message"]


def test_not_json_unknown_model_and_no_key(served: LiveServer) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    reply = httpx.post(f"{served.url}/v1/responses", content=b"{nope", headers=headers)
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error"
    assert _post(served, _body(model="nope")).status_code == 404
    no_key = httpx.post(f"{served.url}/v1/responses", json=_body())
    assert no_key.status_code == 401 and "error" in no_key.json()


def test_accepted_fields_that_do_nothing_here(served: LiveServer) -> None:
    body = _body(
        store=False,
        reasoning={"effort": "low", "summary": "auto"},
        include=["reasoning.encrypted_content", "web_search_call.results"],
        prompt_cache_key="k",
        client_metadata={"x": "y"},
        metadata={"team": "a"},
        service_tier="auto",
        user="u",
        truncation="disabled",
        parallel_tool_calls=False,
        text={"format": {"type": "text"}, "verbosity": "low"},
        tools=[{"type": "web_search"}, {"type": "custom", "name": "x"}],
        stream_options={"include_obfuscation": False},
    )
    reply = _post(served, body)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["metadata"] == {"team": "a"} and data["store"] is False
    assert data["tools"] == [] and len(data["warnings"]) == 2
    assert data["prompt_cache_key"] == "k" and data["user"] == "u"


def test_the_sdk_raises_its_typed_errors(served: LiveServer) -> None:
    url = f"{served.url}/v1"
    with openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0, timeout=60) as client:
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="llama", input="hi", previous_response_id="resp_x")
        assert "keeps no responses" in err.value.message
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model="nope", input="hi")
        with pytest.raises(openai.BadRequestError):
            client.responses.create(model="llama", input="hi", stream=True, store=True)
