"""Logprobs and echo on the batched path (prompt batches, `n`, `best_of`): lm-evaluation-harness's
loglikelihood request with several token-id prompts in one body equals transformers per prompt,
and each of `n` choices carries its own logprobs, read by the official `openai` client."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import torch

from tests.runtime.server.live import API_KEY, LiveServer

TOL = 1e-4
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
AS_IDS: dict[str, Any] = {"return_tokens_as_token_ids": True, "ignore_eos": True}


@pytest.fixture
def client(served: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{served.url}/v1", api_key=API_KEY, max_retries=0, timeout=60
    ) as client:
        yield client


@pytest.fixture(scope="module")
def hf_model(served: LiveServer) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    path = served.state.router.pick("llama").engine.loaded.path
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_logprobs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab]: row p is log_softmax of transformers' logits after ids[: p + 1]."""
    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def tokenizer_of(served: LiveServer) -> Any:
    return served.state.router.pick("llama").engine.tokenizer


def as_id(token: str) -> int:
    assert token.startswith("token_id:"), token
    return int(token.removeprefix("token_id:"))


def test_lm_eval_multiple_choice_batch_equals_transformers(
    served: LiveServer, hf_model: torch.nn.Module
) -> None:
    """Every (context, continuation) of a small multiple-choice set in ONE request, as
    lm-evaluation-harness's local-completions batches them: a list of token-id lists, echo,
    logprobs 1, max_tokens 1, temperature 0. Choice i answers prompt i; its
    sum(token_logprobs[ctxlen:-1]) and greedy flag equal transformers'."""
    tokenizer = tokenizer_of(served)
    questions = [
        ("Question: what do caches hold? Answer:", [" pages", " keys and values", " nothing"]),
        ("The capital of the batch is", [" the queue", " a token", " memory"]),
    ]
    requests = [
        (tokenizer.encode(context), tokenizer.encode(cont, add_special_tokens=False))
        for context, continuations in questions
        for cont in continuations
    ]
    body = {
        "model": "llama",
        "prompt": [ctx + cont for ctx, cont in requests],
        "max_tokens": 1,
        "logprobs": 1,
        "echo": True,
        "temperature": 0,
        "seed": 1234,
    }
    response = httpx.post(f"{served.url}/v1/completions", json=body, headers=HEADERS, timeout=60)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert [c["index"] for c in choices] == list(range(len(requests)))
    scores = []
    for choice, (ctx, cont) in zip(choices, requests, strict=True):
        lp = choice["logprobs"]
        ids = ctx + cont
        assert len(lp["token_logprobs"]) == len(ids) + 1  # the prompt, then the sampled token
        assert lp["token_logprobs"][0] is None
        ctxlen = len(ctx)
        ours = sum(lp["token_logprobs"][ctxlen:-1])
        greedy = all(
            value == max(top.values())
            for value, top in zip(
                lp["token_logprobs"][ctxlen:-1], lp["top_logprobs"][ctxlen:-1], strict=True
            )
        )
        rows = hf_logprobs(hf_model, ids)[ctxlen - 1 : ctxlen - 1 + len(cont)]
        targets = torch.tensor(cont)
        theirs = float(rows.gather(1, targets.unsqueeze(1)).sum())
        assert abs(ours - theirs) < TOL * len(cont)
        assert greedy == bool((rows.argmax(dim=1) == targets).all())
        scores.append(ours)
    assert len(set(scores)) == len(scores)  # each prompt scored apart, none answered twice
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == sum(len(c) + len(k) for c, k in requests)


def _check_sampled(
    hf_model: torch.nn.Module, prompt_ids: list[int], lp: Any, k: int, offset: int = 0
) -> list[int]:
    """The sampled positions of a completion's logprobs (from `offset`) equal transformers'
    log_softmax after the prompt and the choice's own earlier tokens; returns the token ids."""
    sampled = [as_id(t) for t in lp.tokens[offset:]]
    expected = hf_logprobs(hf_model, prompt_ids + sampled)
    for i, token_id in enumerate(sampled):
        row = expected[len(prompt_ids) - 1 + i]
        value = lp.token_logprobs[offset + i]
        assert value is not None and abs(value - float(row[token_id])) < TOL
        top = lp.top_logprobs[offset + i]
        values, top_ids = row.topk(k)
        for t, v in zip(top_ids.tolist(), values.tolist(), strict=True):
            assert abs(top[f"token_id:{t}"] - v) < TOL
    return sampled


def test_n_choices_each_carry_their_own_logprobs(
    client: openai.OpenAI, served: LiveServer, hf_model: torch.nn.Module
) -> None:
    prompt = "The cache keeps pages of keys"
    ids = tokenizer_of(served).encode(prompt)
    result = client.completions.create(
        model="llama",
        prompt=prompt,
        n=2,
        max_tokens=6,
        seed=11,
        temperature=1.0,
        logprobs=2,
        extra_body=AS_IDS,
    )
    assert [c.index for c in result.choices] == [0, 1]
    sampled = []
    for choice in result.choices:
        lp = choice.logprobs
        assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
        assert len(lp.tokens) == 6
        sampled.append(_check_sampled(hf_model, ids, lp, 2))
    assert sampled[0] != sampled[1]  # two samples, two sets of logprobs (not one copied)

    echoed = client.completions.create(
        model="llama",
        prompt=prompt,
        n=2,
        max_tokens=6,
        seed=11,
        temperature=1.0,
        logprobs=2,
        echo=True,
        extra_body=AS_IDS,
    )
    expected = hf_logprobs(hf_model, ids)
    for choice, alone in zip(echoed.choices, sampled, strict=True):
        lp = choice.logprobs
        assert lp is not None and lp.tokens and lp.token_logprobs is not None
        assert choice.text.startswith(prompt)
        assert [as_id(t) for t in lp.tokens[: len(ids)]] == ids  # every choice echoes the prompt
        assert lp.token_logprobs[0] is None
        for p in range(1, len(ids)):
            value = lp.token_logprobs[p]
            assert value is not None and abs(value - float(expected[p - 1, ids[p]])) < TOL
        assert _check_sampled(hf_model, ids, lp, 2, offset=len(ids)) == alone  # same seeds


def test_best_of_returns_the_highest_summed_logprobs(client: openai.OpenAI) -> None:
    result = client.completions.create(
        model="llama",
        prompt="Batching requests",
        n=2,
        best_of=4,
        max_tokens=5,
        seed=3,
        logprobs=0,
        extra_body=AS_IDS,
    )
    sums = []
    for choice in result.choices:
        lp = choice.logprobs
        assert lp is not None and lp.token_logprobs is not None and len(lp.token_logprobs) == 5
        sums.append(sum(v for v in lp.token_logprobs if v is not None))
    assert sums == sorted(sums, reverse=True)  # ranked by the logprobs the choices carry


def test_chat_n_logprobs_parse_and_stream_the_same(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": "llama",
        "messages": [{"role": "user", "content": "Say something"}],
        "n": 2,
        "max_tokens": 5,
        "seed": 9,
        "logprobs": True,
        "top_logprobs": 2,
        "extra_body": {"ignore_eos": True},
    }
    whole = client.chat.completions.create(**kwargs)
    assert [c.index for c in whole.choices] == [0, 1]
    per_choice: dict[int, list[float]] = {}
    for choice in whole.choices:
        assert choice.logprobs is not None and choice.logprobs.content is not None
        content = choice.logprobs.content
        assert len(content) == 5 and all(len(t.top_logprobs) == 2 for t in content)
        assert all(t.logprob <= max(a.logprob for a in t.top_logprobs) + TOL for t in content)
        per_choice[choice.index] = [t.logprob for t in content]
    streamed: dict[int, list[float]] = defaultdict(list)
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            if c.logprobs is not None and c.logprobs.content:
                streamed[c.index].extend(t.logprob for t in c.logprobs.content)
    assert streamed.keys() == per_choice.keys()
    for index, values in per_choice.items():  # the same tokens; a step's batch may differ
        assert streamed[index] == pytest.approx(values, abs=TOL)


def test_streamed_batch_with_echo_equals_the_whole_response(served: LiveServer) -> None:
    body: dict[str, Any] = {
        "model": "llama",
        "prompt": ["The cache holds", "Batching requests"],
        "max_tokens": 4,
        "logprobs": 1,
        "echo": True,
        "temperature": 0,
        "ignore_eos": True,
    }
    url = f"{served.url}/v1/completions"
    whole = httpx.post(url, json=body, headers=HEADERS, timeout=60).json()["choices"]
    tokens: dict[int, list[str]] = defaultdict(list)
    values: dict[int, list[float | None]] = defaultdict(list)
    texts: dict[int, str] = defaultdict(str)
    with httpx.stream("POST", url, json={**body, "stream": True}, headers=HEADERS) as stream:
        for line in stream.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for c in json.loads(line.removeprefix("data: "))["choices"]:
                texts[c["index"]] += c["text"]
                if c["logprobs"] is not None:
                    tokens[c["index"]] += c["logprobs"]["tokens"]
                    values[c["index"]] += c["logprobs"]["token_logprobs"]
    for choice in whole:
        i = choice["index"]
        assert texts[i] == choice["text"] and tokens[i] == choice["logprobs"]["tokens"]
        assert values[i] == pytest.approx(choice["logprobs"]["token_logprobs"], abs=TOL)


def test_constraint_masks_apply_with_controls_and_logprobs(client: openai.OpenAI) -> None:
    """Issue 30's grammar mask is applied whether or not a row uses part A's controls, after
    them: a +100 logit_bias cannot lift a forbidden token, min_tokens does not keep a completed
    grammar running (its end finishes the choice), and logprobs come with every token (n = 2
    too)."""
    options = ("alpha", "beta", "gamma ray")
    extra: dict[str, Any] = {"guided_choice": list(options), "min_tokens": 10}
    for seed in range(3):
        out = client.completions.create(
            model="llama",
            prompt="Pick:",
            n=2,
            max_tokens=20,
            seed=seed,
            logprobs=1,
            logit_bias={"5": 100, "7": 100},
            presence_penalty=1.5,
            extra_body=extra,
        )
        for choice in out.choices:
            assert choice.text in options and choice.finish_reason == "stop", choice
            lp = choice.logprobs
            assert lp is not None and lp.token_logprobs and len(lp.token_logprobs) >= 1
            assert all(v is not None and v <= 0 for v in lp.token_logprobs)
