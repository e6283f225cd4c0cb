"""/v1/messages on the real model (SmolLM2-135M-Instruct): the official `anthropic` SDK gets a
greedy answer identical to the chat path's for the same conversation (the `openai` SDK as the
reference), with usage that adds up to count_tokens."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import anthropic
import openai
import pytest

from tests.fixtures.real_model import SERVED_NAME
from tests.runtime.server.live import (
    API_KEY,
    LiveServer,
    engine_for,
    light_settings,
    live_server,
    router_of,
)

QUESTION = "What is the capital of France? Answer in one word."


@pytest.fixture(scope="module")
def served(smollm2_dir: Path) -> Iterator[LiveServer]:
    engine = partial(engine_for, smollm2_dir, name=SERVED_NAME, batch_warmup=False)
    with live_server(light_settings(), router_of(**{SERVED_NAME: engine})) as server:
        yield server


def test_create_on_the_real_model_matches_the_chat_path(served: LiveServer) -> None:
    client = anthropic.Anthropic(base_url=served.url, api_key=API_KEY, max_retries=0)
    message = client.messages.create(
        model=SERVED_NAME,
        max_tokens=32_000,  # as Claude Code asks: clamped to the context's room
        system="You are a helpful assistant.",
        messages=[{"role": "user", "content": QUESTION}],
        extra_body={"temperature": 0},
        timeout=120,
    )
    text = "".join(block.text for block in message.content if block.type == "text")
    assert text.strip() and message.stop_reason == "end_turn"
    reference = openai.OpenAI(base_url=f"{served.url}/v1", api_key=API_KEY, max_retries=0)
    chat = reference.chat.completions.create(
        model=SERVED_NAME,
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": QUESTION},
        ],
        max_tokens=message.usage.output_tokens + 8,
        temperature=0,
    )
    assert text == chat.choices[0].message.content
    counted = client.messages.count_tokens(
        model=SERVED_NAME,
        system="You are a helpful assistant.",
        messages=[{"role": "user", "content": QUESTION}],
    )
    cache_read = message.usage.cache_read_input_tokens or 0
    assert message.usage.input_tokens + cache_read == counted.input_tokens
