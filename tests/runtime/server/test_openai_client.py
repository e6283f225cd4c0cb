"""The official `openai` client against a live server on the real engine (tiny random models)."""

from __future__ import annotations

import base64
import struct

import httpx
import openai
import pytest
import torch

from tests.runtime.server.live import API_KEY, LiveServer


@pytest.fixture
def client(served: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def test_completion_matches_the_engine_and_reports_usage(
    client: openai.OpenAI, served: LiveServer
) -> None:
    result = client.completions.create(model="llama", prompt="Hello there", max_tokens=7, seed=3)
    engine = served.state.router.pick("llama").engine
    prompt_ids = engine.tokenizer.encode("Hello there")
    assert result.object == "text_completion" and result.model == "llama"
    assert result.usage is not None
    assert result.usage.prompt_tokens == len(prompt_ids)
    assert result.usage.completion_tokens == 7
    assert result.usage.total_tokens == len(prompt_ids) + 7
    assert result.choices[0].finish_reason == "length"
    # greedy (temperature 0) is deterministic: same text through the API and from token ids
    greedy = client.completions.create(
        model="llama", prompt="Hello there", max_tokens=6, temperature=0
    )
    by_ids = client.completions.create(
        model="llama", prompt=prompt_ids, max_tokens=6, temperature=0
    )
    assert greedy.choices[0].text == by_ids.choices[0].text


def test_chat_uses_the_chat_template(client: openai.OpenAI, served: LiveServer) -> None:
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    result = client.chat.completions.create(
        model="llama", messages=messages, max_tokens=5, temperature=0
    )
    tokenizer = served.state.router.pick("llama").engine.tokenizer
    expected_prompt = len(tokenizer.encode(tokenizer.apply_chat_template(messages)))
    assert result.object == "chat.completion"
    assert result.choices[0].message.role == "assistant"
    assert result.usage is not None and result.usage.prompt_tokens == expected_prompt
    assert result.usage.completion_tokens == 5


def test_streaming_chat_with_usage_chunk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="llama",
        messages=[{"role": "user", "content": "Count"}],
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert [c.choices[0].finish_reason for c in finals] == ["length"]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 6
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = client.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "Count"}], max_tokens=6, temperature=0
    )
    assert streamed == whole.choices[0].message.content


def test_streaming_completion_without_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model="llama", prompt="a", max_tokens=4, temperature=0, stream=True
        )
    )
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_embeddings_match_the_encoder(client: openai.OpenAI, served: LiveServer) -> None:
    texts = ["the cat sat", "a dog"]
    result = client.embeddings.create(model="bert", input=texts)  # the client asks for base64
    loaded = served.state.router.pick("bert").engine.loaded
    ids = [loaded.tokenizer.encode(t) for t in texts]
    width = max(map(len, ids))
    input_ids = torch.tensor([row + [0] * (width - len(row)) for row in ids])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
    with torch.inference_mode():
        expected = loaded.model.embed(input_ids, mask)
    got = torch.tensor([d.embedding for d in result.data])
    torch.testing.assert_close(got, expected.float(), rtol=1e-5, atol=1e-5)
    assert result.usage.prompt_tokens == sum(map(len, ids))
    floats = client.embeddings.create(model="bert", input="a dog", encoding_format="float")
    torch.testing.assert_close(torch.tensor(floats.data[0].embedding), got[1])


def test_models_list(client: openai.OpenAI) -> None:
    assert sorted(m.id for m in client.models.list()) == ["bert", "llama"]


def test_typed_errors(client: openai.OpenAI, served: LiveServer) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as negative:
        client.completions.create(model="llama", prompt="x", max_tokens=-1)
    assert negative.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as n_two:
        client.completions.create(model="llama", prompt="x", n=17)
    assert n_two.value.param == "n"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model="llama", prompt=[5] * 4000, max_tokens=2)
    assert too_long.value.param == "prompt"
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="llama", input="generative models do not embed")
    anonymous = openai.OpenAI(base_url=f"{served.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        anonymous.models.list()
    missing = httpx.get(f"{served.url}/v1/models")
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"


def test_validation_failures_are_counted(served: LiveServer, client: openai.OpenAI) -> None:
    def failures() -> float:
        text = httpx.get(f"{served.url}/metrics").text
        rows = [
            f'fastllm_request_failure_total{{endpoint="{endpoint}",model="llama",'
            'reason="validation",version="stable"}'
            for endpoint in ("completions", "chat")  # the counters are labelled by endpoint
        ]
        return sum(
            float(next(row.split()[-1] for row in text.splitlines() if row.startswith(line)))
            for line in rows
        )

    before = failures()
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="llama", prompt="x", temperature=5)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="llama", messages=[], max_tokens=1)
    assert failures() == before + 2


def test_base64_decoding_is_little_endian_float32() -> None:
    from runtime.server.openai.routes import _encode

    raw = base64.b64decode(_encode([1.5, -2.0], "base64"))
    assert struct.unpack("<2f", raw) == (1.5, -2.0)


def test_usage_reports_prompt_tokens_served_from_the_prefix_cache(
    client: openai.OpenAI, served: LiveServer
) -> None:
    system = "You answer questions about page tables and caches. " * 8  # several 16-token pages
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Why?"}]
    tokenizer = served.state.router.pick("llama").engine.tokenizer
    num_prompt = len(tokenizer.encode(tokenizer.apply_chat_template(messages)))
    first = client.chat.completions.create(
        model="llama", messages=messages, max_tokens=3, temperature=0
    )
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    # nobody computed this system prompt before: at most the chat template's first tokens,
    # which earlier tests' prompts share, are copied from part of a cached page
    assert first.usage.prompt_tokens_details.cached_tokens < 16
    again = client.chat.completions.create(
        model="llama", messages=messages, max_tokens=3, temperature=0
    )
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    # every full page but the one holding the last prompt token (which is always computed);
    # and all but that token when the first request filled that page (its K/V holds the prompt
    # and 2 of its 3 tokens), whose first tokens are then copied
    whole = (num_prompt - 1) // 16 * 16
    filled = (num_prompt + 2) // 16 * 16 > whole
    expected = num_prompt - 1 if filled else whole
    assert again.usage.prompt_tokens_details.cached_tokens == expected > 0
    assert again.choices[0].message.content == first.choices[0].message.content
    streamed = list(
        client.chat.completions.create(
            model="llama",
            messages=messages,
            max_tokens=3,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = streamed[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == (num_prompt - 1) // 16 * 16
    prompt = system + " A completion prompt."
    client.completions.create(model="llama", prompt=prompt, max_tokens=2, temperature=0)
    completion = client.completions.create(
        model="llama", prompt=prompt, max_tokens=2, temperature=0
    )
    assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens > 0
