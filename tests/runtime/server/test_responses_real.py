"""/v1/responses on the real model (SmolLM2-135M-Instruct, marker `real_model`): greedy text as
transformers generates it from the same chat (instructions as the system message), the same text
streamed, and a forced function call whose arguments validate."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
import torch

from tests.fixtures.real_model import SERVED_NAME
from tests.runtime.server.live import (
    API_KEY,
    engine_for,
    light_settings,
    live_server,
    router_of,
)
from tests.runtime.server.test_responses_api import TOOL, WEATHER
from tests.runtime.server.test_responses_stream import check_events, collect

pytestmark = pytest.mark.real_model
GREEDY_TOKENS = 24


@pytest.fixture(scope="module")
def client(smollm2_dir: Path, smollm2_ours: Any) -> Iterator[openai.OpenAI]:
    engine = partial(
        engine_for,
        smollm2_dir,
        name=SERVED_NAME,
        batch_warmup=False,
        loader=lambda: smollm2_ours,  # the group's one load (tests/fixtures/real_model.py)
    )
    with live_server(light_settings(), router_of(**{SERVED_NAME: engine})) as server:
        url = f"{server.url}/v1"
        with openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0, timeout=120) as client:
            yield client


def test_greedy_text_matches_transformers_and_streams_the_same(
    client: openai.OpenAI, smollm2_hf: tuple[Any, Any]
) -> None:
    hf_tokenizer, hf_model = smollm2_hf
    system = "You are a terse assistant. Answer in one sentence."
    question = "Why is the sky blue?"
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    ids = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=GREEDY_TOKENS, do_sample=False)
    expected = hf_tokenizer.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True)
    args: dict[str, Any] = {
        "model": SERVED_NAME,
        "instructions": system,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": question}]}],
        "max_output_tokens": GREEDY_TOKENS,
        "temperature": 0,
    }
    result = client.responses.create(**args)
    assert result.output_text == expected
    assert result.usage is not None and result.usage.input_tokens == len(ids)
    final = check_events(collect(client.responses.create(stream=True, **args)))
    assert final.output_text == expected


def test_forced_call_on_the_real_model(client: openai.OpenAI) -> None:
    result = client.responses.create(
        model=SERVED_NAME,
        input="What is the weather in Paris for the next 3 days?",
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60,
        temperature=0,
    )
    (call,) = result.output
    assert call.type == "function_call" and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
