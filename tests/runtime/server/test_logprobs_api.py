"""Logprobs, echo and the sampling controls through the HTTP API: the official `openai` client
parses every new field, the values equal `torch.log_softmax` of transformers' logits, and a
loglikelihood computed as lm-evaluation-harness's `local-completions` does equals the one
computed with transformers directly."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
import torch

from tests.runtime.server.live import API_KEY, LiveServer

TOL = 1e-4
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture
def client(served: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def hf_model(served: LiveServer) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    path = served.state.router.pick("llama").engine.loaded.path
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_logprobs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab]: row p is log_softmax of the logits after ids[: p + 1]."""
    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def tokenizer_of(served: LiveServer) -> Any:
    return served.state.router.pick("llama").engine.tokenizer


def text_of(served: LiveServer, token_id: int) -> str:
    return str(tokenizer_of(served).decode([token_id], skip_special_tokens=False))


def as_id(token: str) -> int:
    assert token.startswith("token_id:"), token
    return int(token.removeprefix("token_id:"))


def test_completion_logprobs_with_echo_match_transformers(
    client: openai.OpenAI, served: LiveServer, hf_model: torch.nn.Module
) -> None:
    prompt = "The cache keeps pages of keys"
    ids = tokenizer_of(served).encode(prompt)
    kwargs: dict[str, Any] = {"model": "llama", "prompt": prompt, "max_tokens": 5, "seed": 5}
    result = client.completions.create(
        logprobs=3, echo=True, extra_body={"return_tokens_as_token_ids": True}, **kwargs
    )
    choice = result.choices[0]
    assert choice.text.startswith(prompt)
    lp = choice.logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    n = len(ids) + 5
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n
    all_ids = [as_id(t) for t in lp.tokens]
    assert all_ids[: len(ids)] == ids
    expected = hf_logprobs(hf_model, all_ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for p in range(1, n):
        row, value = expected[p - 1], lp.token_logprobs[p]
        assert value is not None and abs(value - float(row[all_ids[p]])) < TOL
        top = lp.top_logprobs[p]
        assert top is not None and lp.tokens[p] in top  # the token itself is always named
        values, top_ids = row.topk(3)
        for t, v in zip(top_ids.tolist(), values.tolist(), strict=True):
            assert abs(top[f"token_id:{t}"] - v) < TOL
    # the same request in text form: each token's own decoding, offsets into `text`
    texts = client.completions.create(logprobs=3, echo=True, **kwargs).choices[0]
    assert texts.logprobs is not None and texts.logprobs.tokens is not None
    assert texts.logprobs.tokens == [text_of(served, t) for t in all_ids]
    assert texts.logprobs.token_logprobs == lp.token_logprobs
    assert texts.logprobs.text_offset == [
        sum(len(t) for t in texts.logprobs.tokens[:i]) for i in range(n)
    ]


def test_loglikelihood_as_lm_eval_harness_computes_it(
    served: LiveServer, hf_model: torch.nn.Module
) -> None:
    """lm-eval's local-completions: token-id prompt (context + continuation), echo,
    logprobs 1, max_tokens 1, temperature 0; sum of token_logprobs[ctxlen:-1], greedy when each
    of those is the top alternative."""
    tokenizer = tokenizer_of(served)
    questions = [
        ("Question: what do caches hold? Answer:", [" pages", " keys and values", " nothing"]),
        ("The capital of the batch is", [" the queue", " a token", " memory"]),
    ]
    for context, continuations in questions:
        scores = []
        for continuation in continuations:
            ctx = tokenizer.encode(context)
            cont = tokenizer.encode(continuation, add_special_tokens=False)
            body = {
                "model": "llama",
                "prompt": [ctx + cont],  # lm-eval sends batches of token-id lists
                "max_tokens": 1,
                "logprobs": 1,
                "echo": True,
                "temperature": 0,
                "seed": 1234,
            }
            response = httpx.post(
                f"{served.url}/v1/completions", json=body, headers=HEADERS, timeout=60
            )
            assert response.status_code == 200, response.text
            lp = response.json()["choices"][0]["logprobs"]
            ctxlen = len(ctx)
            ours = sum(lp["token_logprobs"][ctxlen:-1])
            greedy = all(
                tok == max(top.values())
                for tok, top in zip(
                    lp["token_logprobs"][ctxlen:-1], lp["top_logprobs"][ctxlen:-1], strict=True
                )
            )
            expected = hf_logprobs(hf_model, ctx + cont)
            targets = torch.tensor(cont)
            rows = expected[ctxlen - 1 : ctxlen - 1 + len(cont)]
            theirs = float(rows.gather(1, targets.unsqueeze(1)).sum())
            their_greedy = bool((rows.argmax(dim=1) == targets).all())
            assert abs(ours - theirs) < TOL * len(cont)
            assert greedy == their_greedy
            scores.append(ours)
        assert len(set(scores)) == len(scores)  # distinct answers scored apart


def test_chat_logprobs_parse_and_match(
    client: openai.OpenAI, served: LiveServer, hf_model: torch.nn.Module
) -> None:
    messages: Any = [{"role": "user", "content": "Name a color"}]
    kwargs: dict[str, Any] = {"model": "llama", "messages": messages, "max_tokens": 4}
    kwargs.update(temperature=0, logprobs=True, top_logprobs=2)
    result = client.chat.completions.create(
        **kwargs, extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True}
    )
    assert result.choices[0].logprobs is not None
    content = result.choices[0].logprobs.content
    assert content is not None and len(content) == 4
    tokenizer = tokenizer_of(served)
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages))
    sampled = [as_id(c.token) for c in content]
    expected = hf_logprobs(hf_model, prompt + sampled)
    for j, entry in enumerate(content):
        row = expected[len(prompt) - 1 + j]
        assert abs(entry.logprob - float(row[sampled[j]])) < TOL
        values, top_ids = row.topk(2)
        assert [as_id(t.token) for t in entry.top_logprobs] == top_ids.tolist()
        for alt, v in zip(entry.top_logprobs, values.tolist(), strict=True):
            assert abs(alt.logprob - v) < TOL
    texts = client.chat.completions.create(**kwargs, extra_body={"ignore_eos": True})
    assert texts.choices[0].logprobs is not None
    for entry, token_id in zip(texts.choices[0].logprobs.content or [], sampled, strict=True):
        assert entry.token == text_of(served, token_id)
        assert entry.bytes == list(entry.token.encode())


def test_streamed_logprobs_equal_the_whole_response(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": "llama", "max_tokens": 6, "temperature": 0}
    whole = client.completions.create(prompt="Stream me", logprobs=2, echo=True, **kwargs)
    tokens: list[str] = []
    values: list[float | None] = []
    text = ""
    for chunk in client.completions.create(
        prompt="Stream me", logprobs=2, echo=True, stream=True, **kwargs
    ):
        choice = chunk.choices[0]
        text += choice.text
        if choice.logprobs is not None:
            tokens += choice.logprobs.tokens or []
            values += choice.logprobs.token_logprobs or []
    assert whole.choices[0].logprobs is not None
    assert text == whole.choices[0].text
    assert tokens == whole.choices[0].logprobs.tokens
    assert values == whole.choices[0].logprobs.token_logprobs
    messages: Any = [{"role": "user", "content": "Stream me"}]
    chat_whole = client.chat.completions.create(messages=messages, logprobs=True, **kwargs)
    streamed: list[Any] = []
    for chat_chunk in client.chat.completions.create(
        messages=messages, logprobs=True, stream=True, **kwargs
    ):
        if chat_chunk.choices and chat_chunk.choices[0].logprobs is not None:
            streamed += chat_chunk.choices[0].logprobs.content or []
    assert chat_whole.choices[0].logprobs is not None
    assert [c.token for c in streamed] == [
        c.token for c in chat_whole.choices[0].logprobs.content or []
    ]


def test_sampling_controls_through_the_client(client: openai.OpenAI, served: LiveServer) -> None:
    forced = 7
    result = client.completions.create(
        model="llama",
        prompt="Hello",
        max_tokens=3,
        logit_bias={str(forced): 100},
        presence_penalty=0.5,
        frequency_penalty=0.5,
        extra_body={"ignore_eos": True},
    )
    assert result.choices[0].text == tokenizer_of(served).decode([forced] * 3)
    eos = tokenizer_of(served).eos_token_ids[0]
    held = client.completions.create(
        model="llama",
        prompt="Hello",
        max_tokens=8,
        temperature=0,
        logit_bias={str(eos): 100},
        extra_body={"min_tokens": 3, "repetition_penalty": 1.2},
    )
    assert held.usage is not None and held.usage.completion_tokens == 4
    stopped = client.completions.create(
        model="llama",
        prompt="Hello",
        max_tokens=8,
        logit_bias={str(forced): 100},
        extra_body={"stop_token_ids": [forced]},
    )
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].text == ""


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        ("completions", {"logprobs": 21}, "logprobs"),
        ("completions", {"logprobs": -1}, "logprobs"),
        ("completions", {"logit_bias": {"x1": 1}}, "logit_bias"),
        ("completions", {"logit_bias": {"5": 101}}, "logit_bias"),
        ("completions", {"logit_bias": {"99999": 1}}, "logit_bias"),
        ("completions", {"presence_penalty": 3}, "presence_penalty"),
        ("completions", {"min_tokens": 9, "max_tokens": 2}, "min_tokens"),
        ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ],
)
def test_bad_values_are_typed_400s(
    served: LiveServer, path: str, fields: dict[str, Any], param: str
) -> None:
    base: dict[str, Any] = (
        {"prompt": "hi"}
        if path == "completions"
        else {"messages": [{"role": "user", "content": "hi"}]}
    )
    body = {"model": "llama", "max_tokens": 2, **base, **fields}
    response = httpx.post(f"{served.url}/v1/{path}", json=body, headers=HEADERS, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, json.dumps(error)


def test_max_tokens_zero_with_echo_scores_the_prompt(
    client: openai.OpenAI, served: LiveServer, hf_model: torch.nn.Module
) -> None:
    ids = tokenizer_of(served).encode("Score this prompt only")
    kwargs: dict[str, Any] = {"model": "llama", "prompt": ids, "max_tokens": 0, "echo": True}
    result = client.completions.create(
        logprobs=2, extra_body={"return_tokens_as_token_ids": True}, **kwargs
    )
    choice = result.choices[0]
    assert choice.text == tokenizer_of(served).decode(ids)
    assert choice.logprobs is not None and choice.logprobs.tokens is not None
    assert [as_id(t) for t in choice.logprobs.tokens] == ids
    expected = hf_logprobs(hf_model, ids)
    values = choice.logprobs.token_logprobs or []
    assert values[0] is None
    for p in range(1, len(ids)):
        value = values[p]
        assert value is not None and abs(value - float(expected[p - 1, ids[p]])) < TOL
    assert result.usage is not None and result.usage.completion_tokens == 0
    streamed = "".join(
        c.choices[0].text for c in client.completions.create(stream=True, **kwargs) if c.choices
    )
    assert streamed == choice.text
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="llama", prompt=ids, max_tokens=0)
    assert "max_tokens" in str(info.value)
