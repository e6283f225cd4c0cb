"""Stored responses on a live server with its SQLite database (storage_enabled), through the
official `openai` SDK: `store: true` keeps the final object (joined or streamed) for GET,
`previous_response_id` continues the conversation (the prompt is the chat path's prompt of the
whole conversation), a forced call's output answers it in the next request, another API key sees
none of it, and DELETE removes it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import openai
import pytest
from sqlalchemy import create_engine

from storage.db import current_revision, head_revision
from tests.runtime.server.live import (
    API_KEY,
    LiveServer,
    engine_for,
    light_settings,
    live_server,
    router_of,
)
from tests.runtime.server.test_responses_api import TOOL
from tests.runtime.server.test_responses_stream import check_events, collect

OTHER_KEY = "sk-other-key"


@pytest.fixture(scope="module")
def stored_server(
    demo_model_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('responses-db') / 'fastllm.db'}"
    settings = light_settings(storage_enabled=True, database_url=url, api_keys=[API_KEY, OTHER_KEY])
    make_router = router_of(llama=partial(engine_for, demo_model_dir("llama"), name="llama"))
    with live_server(settings, make_router) as server:
        engine = create_engine(url)
        deadline = time.monotonic() + 60
        while current_revision(engine) != head_revision():  # the writer migrates on start
            assert time.monotonic() < deadline, "the database was never migrated"
            time.sleep(0.05)
        engine.dispose()
        yield server


def _client(server: LiveServer, key: str = API_KEY) -> openai.OpenAI:
    url = f"{server.url}/v1"
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60)


@pytest.fixture
def client(stored_server: LiveServer) -> Iterator[openai.OpenAI]:
    with _client(stored_server) as client:
        yield client


def test_a_stored_response_is_read_back_by_its_key_only(
    client: openai.OpenAI, stored_server: LiveServer
) -> None:
    created = client.responses.create(
        model="llama", input="Hi", max_output_tokens=4, store=True, metadata={"k": "v"}
    )
    assert created.store is True
    read = client.responses.retrieve(created.id)
    assert read.model_dump() == created.model_dump()
    with _client(stored_server, OTHER_KEY) as other:
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            other.responses.delete(created.id)
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    unstored = client.responses.create(model="llama", input="Hi", max_output_tokens=2)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="llama",
        instructions="Be terse.",
        input="Hi",
        max_output_tokens=4,
        temperature=0,
        store=True,
    )
    second = client.responses.create(
        model="llama",
        previous_response_id=first.id,
        input="More",
        max_output_tokens=4,
        temperature=0,
        store=True,
    )
    assert second.previous_response_id == first.id
    # the old instructions are not carried over (OpenAI's rule): the conversation is
    chat = client.chat.completions.create(
        model="llama",
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "More"},
        ],
        max_tokens=4,
        temperature=0,
    )
    assert second.usage is not None and chat.usage is not None
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.output_text == chat.choices[0].message.content
    # a streamed, stored third turn: what GET returns is the stream's final object
    events = collect(
        client.responses.create(
            model="llama",
            previous_response_id=second.id,
            input="Again",
            max_output_tokens=4,
            store=True,
            stream=True,
        )
    )
    final = check_events(events)
    assert client.responses.retrieve(final.id).model_dump() == final.model_dump()


def test_a_stored_call_is_answered_in_the_next_request(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="llama",
        input="Weather in Oslo?",
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60,
        store=True,
    )
    (call,) = first.output
    assert call.type == "function_call"
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    second = client.responses.create(
        model="llama",
        previous_response_id=first.id,
        input=[answer],
        tools=[TOOL],
        tool_choice="none",
        max_output_tokens=3,
    )
    assert second.output[0].type == "message"


def test_an_unknown_previous_response_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="llama", input="Hi", previous_response_id="resp_nope")
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]
