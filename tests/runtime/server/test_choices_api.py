"""Prompt batches, n, best_of, content parts, per-chunk usage and /tokenize, read by the official
`openai` client (its types parse every response) against a live server on the tiny random llama."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.runtime.server.live import API_KEY, LiveServer

PROMPTS = ["The cache holds", "Batching requests"]
IGNORE_EOS: dict[str, Any] = {"ignore_eos": True}  # every choice runs to max_tokens


@pytest.fixture
def client(served: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{served.url}/v1", api_key=API_KEY, max_retries=0, timeout=60
    ) as client:
        yield client


def test_a_prompt_batch_with_n_answers_each_prompt_in_openais_order(client: openai.OpenAI) -> None:
    batch = client.completions.create(
        model="llama", prompt=PROMPTS, n=2, max_tokens=5, seed=7, extra_body=IGNORE_EOS
    )
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    for p, prompt in enumerate(PROMPTS):  # prompt p's choices are p * n + j, as alone
        alone = client.completions.create(
            model="llama", prompt=prompt, n=2, max_tokens=5, seed=7, extra_body=IGNORE_EOS
        )
        assert [c.text for c in batch.choices[2 * p : 2 * p + 2]] == [c.text for c in alone.choices]
    assert batch.usage is not None
    assert batch.usage.completion_tokens == 4 * 5  # every choice counted
    singles = [client.completions.create(model="llama", prompt=p, max_tokens=1) for p in PROMPTS]
    assert batch.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles if s.usage)


def test_token_id_batches_match_single_requests(client: openai.OpenAI, served: LiveServer) -> None:
    tokenizer = served.state.router.pick("llama").engine.tokenizer
    ids = [tokenizer.encode(p) for p in PROMPTS]
    batch = client.completions.create(model="llama", prompt=ids, max_tokens=6, temperature=0)
    singles = [
        client.completions.create(model="llama", prompt=p, max_tokens=6, temperature=0) for p in ids
    ]
    assert [c.text for c in batch.choices] == [s.choices[0].text for s in singles]
    assert [c.index for c in batch.choices] == [0, 1]


def test_chat_with_n_gives_n_distinct_choices(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "Say something"}]
    result = client.chat.completions.create(
        model="llama", messages=messages, n=3, max_tokens=8, seed=5, extra_body=IGNORE_EOS
    )
    assert [c.index for c in result.choices] == [0, 1, 2]
    assert len({c.message.content for c in result.choices}) == 3  # temperature 1
    assert result.usage is not None and result.usage.completion_tokens == 3 * 8


def _streamed(chunks: list[Any], chat: bool) -> dict[int, str]:
    texts: dict[int, str] = defaultdict(str)
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += (choice.delta.content or "") if chat else choice.text
    return dict(texts)


def test_streaming_with_n_tags_each_chunk_with_its_choice(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": "llama", "n": 2, "max_tokens": 6, "seed": 11}
    whole = client.completions.create(prompt=PROMPTS, extra_body=IGNORE_EOS, **kwargs)
    chunks = list(
        client.completions.create(
            prompt=PROMPTS,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=IGNORE_EOS,
            **kwargs,
        )
    )
    assert _streamed(chunks, chat=False) == {c.index: c.text for c in whole.choices}
    finals = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(f.index for f in finals) == [0, 1, 2, 3]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4 * 6


def test_streaming_chat_with_n(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": "llama",
        "messages": [{"role": "user", "content": "Count"}],
        "n": 2,
        "max_tokens": 5,
        "seed": 4,
        "extra_body": IGNORE_EOS,
    }
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    roles = [c.choices[0].index for c in chunks if c.choices[0].delta.role == "assistant"]
    assert roles == [0, 1]
    assert _streamed(chunks, chat=True) == {c.index: c.message.content for c in whole.choices}


def test_best_of_returns_n_of_the_sequences_it_ran(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": "llama", "prompt": "Rank", "max_tokens": 4, "seed": 21}
    three = client.completions.create(n=3, extra_body=IGNORE_EOS, **kwargs)
    best = client.completions.create(n=1, best_of=3, extra_body=IGNORE_EOS, **kwargs)
    assert len(best.choices) == 1 and best.choices[0].index == 0
    assert best.choices[0].text in {c.text for c in three.choices}  # same seed streams
    assert best.usage is not None and best.usage.completion_tokens == 3 * 4


def test_continuous_usage_stats_put_usage_in_every_chunk(client: openai.OpenAI) -> None:
    options: Any = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(
        client.completions.create(
            model="llama", prompt="a", max_tokens=5, temperature=0, stream=True,
            stream_options=options, extra_body=IGNORE_EOS,
        )
    )  # fmt: skip
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks if c.usage]
    assert counts == sorted(counts) and counts[-1] == 5
    assert chunks[-1].choices == []  # include_usage's own last chunk


def test_chat_content_parts_are_joined(client: openai.OpenAI) -> None:
    parts: Any = [{"type": "text", "text": "Be"}, {"type": "text", "text": "terse"}]
    joined = [{"role": "user", "content": "Be\nterse"}]
    kwargs: dict[str, Any] = {"model": "llama", "max_tokens": 6, "temperature": 0}
    with_parts = client.chat.completions.create(
        messages=[{"role": "user", "content": parts}], **kwargs
    )
    plain = client.chat.completions.create(messages=joined, **kwargs)  # type: ignore[arg-type]
    assert with_parts.choices[0].message.content == plain.choices[0].message.content
    assert with_parts.usage is not None and plain.usage is not None
    assert with_parts.usage.prompt_tokens == plain.usage.prompt_tokens


@pytest.mark.parametrize(
    ("kwargs", "param", "needle"),
    [
        ({"prompt": "x", "n": 17}, "n", "less than or equal to 16"),
        ({"prompt": "x", "n": 2, "best_of": 1}, "best_of", "best_of must be >= n"),
        ({"prompt": ["a", ""]}, "prompt", "at least 1 character"),
        ({"prompt": ["a"] * 33}, "prompt", "at most 32"),
        ({"prompt": [[5, 6], []]}, "prompt", "at least 1 item"),
        ({"prompt": "x", "best_of": 2, "stream": True}, "best_of", "cannot be streamed"),
    ],
)
def test_bad_batches_and_choices_are_400s_naming_the_field(
    client: openai.OpenAI, kwargs: dict[str, Any], param: str, needle: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="llama", max_tokens=2, **kwargs)
    assert err.value.param == param
    assert needle in err.value.message


def test_non_text_content_parts_are_400s_naming_the_type(client: openai.OpenAI) -> None:
    image: Any = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="llama", messages=[{"role": "user", "content": image}], max_tokens=2
        )
    assert err.value.param == "messages" and "'image_url'" in err.value.message
    with pytest.raises(openai.BadRequestError) as chat_n:
        client.chat.completions.create(
            model="llama", messages=[{"role": "user", "content": "x"}], n=0, max_tokens=2
        )
    assert chat_n.value.param == "n"


def test_tokenize_and_detokenize(served: LiveServer) -> None:
    tokenizer = served.state.router.pick("llama").engine.tokenizer
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=served.url, headers=headers, timeout=30) as http:
        text = "Tokenize this, please."
        got = http.post("/tokenize", json={"model": "llama", "prompt": text}).json()
        assert got["tokens"] == tokenizer.encode(text) and got["count"] == len(got["tokens"])
        assert got["max_model_len"] > 0
        bare = http.post(
            "/tokenize", json={"model": "llama", "prompt": text, "add_special_tokens": False}
        ).json()
        assert bare["tokens"] == tokenizer.encode(text, add_special_tokens=False)
        messages = [{"role": "user", "content": "Hi"}]
        chat = http.post("/tokenize", json={"model": "llama", "messages": messages}).json()
        rendered = tokenizer.apply_chat_template(messages)
        assert chat["tokens"] == tokenizer.encode(rendered, add_special_tokens=False)
        back = http.post("/detokenize", json={"model": "llama", "tokens": bare["tokens"]})
        assert back.status_code == 200 and back.json()["prompt"] == tokenizer.decode(
            bare["tokens"], skip_special_tokens=False
        )
        bad = http.post("/detokenize", json={"model": "llama", "tokens": [10**9]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
        default = http.post("/tokenize", json={"prompt": text})  # no model: the default one
        assert default.status_code == 200 and default.json()["count"] > 0
        unknown = http.post("/tokenize", json={"model": "nope", "prompt": text})
        assert unknown.status_code == 404
    anonymous = httpx.post(f"{served.url}/tokenize", json={"model": "llama", "prompt": "x"})
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["type"] == "authentication_error"
