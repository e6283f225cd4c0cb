"""The completions and chat bodies of requests with several prompts or choices (or per-chunk usage):
the routes hand such requests here (runtime.server.openai.choices runs them), and keep their own
path for one prompt and one choice, which is the common case and stays as fast as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request

from runtime.engine.constraints import ConstraintSpec
from runtime.engine.request import TokenOutput
from runtime.errors import InvalidRequestError
from runtime.server.openai import choices as ch
from runtime.server.openai import generate as gen
from runtime.server.openai.choice_logprobs import ChatChoiceLogprobs, CompletionChoiceShapers
from runtime.server.openai.controls import (
    chat_logprob_fields,
    completion_logprob_fields,
    scored_max_tokens,
)
from runtime.server.openai.schemas import ChatCompletionRequest, CompletionRequest, _Sampling
from runtime.server.openai.streaming import EventStream
from runtime.serving.router import Route


def is_plain(body: _Sampling) -> bool:
    """One prompt, one choice, no per-chunk usage: the routes' own path."""
    if body.n != 1 or body.continuous_usage:
        return False
    if isinstance(body, CompletionRequest):
        return body.best_of in (None, 1) and len(body.prompts) == 1
    return True


def _check_stream(body: _Sampling, best_of: int | None) -> None:
    if body.stream and best_of is not None and best_of > body.n:
        # the ranking needs every sequence's end: nothing could be streamed before it
        raise InvalidRequestError("best_of > n cannot be streamed", param="best_of")


def _base(rid: str, created: int, model: str, obj: str) -> Callable[[], dict[str, Any]]:
    return lambda: {"id": rid, "object": obj, "created": created, "model": model}


async def completions(
    body: CompletionRequest,
    request: Request,
    rid: str,
    route: Route,
    default_max_tokens: int,
    constraint: ConstraintSpec | None = None,
) -> Any:
    _check_stream(body, body.best_of)
    tokenizer = route.engine.tokenizer
    prompts = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in body.prompts]

    def params(ids: list[int]) -> Any:
        limit = scored_max_tokens(body) or gen.default_max_tokens(
            route.engine, len(ids), default_max_tokens
        )
        return gen.sampling_params(body, limit, **completion_logprob_fields(body))

    subs = ch.submit_prompts(
        request,
        route,
        rid,
        prompts,
        params,
        operation="text_completion",
        user=body.user,
        constraint=constraint,
        cache_salt=body.cache_salt,
    )
    base = _base(rid, subs[0].created, route.model, "text_completion")
    shapers = CompletionChoiceShapers(tokenizer, body, prompts)  # echo, logprobs

    if body.stream:

        def chunk(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
            payload = base()
            payload["choices"] = [
                {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": None}
            ]
            return payload

        def rich(
            index: int, outputs: list[TokenOutput], text: str, finish_reason: str | None
        ) -> dict[str, Any]:
            text, logprobs = shapers.shape(index, outputs, text)
            payload = chunk(index, text, finish_reason)
            payload["choices"][0]["logprobs"] = logprobs
            return payload

        usage = gen.usage_chunk_builder(base) if body.include_usage else None
        if usage is not None and shapers.drops_sampled:  # max_tokens 0: nothing is returned
            usage = _without_completion(usage)
        events = ch.choice_events(
            subs,
            body.n,
            chunk,
            usage=usage,
            continuous_usage=body.continuous_usage,
            rich=rich if shapers.active else None,
        )
        return EventStream(events, on_close=lambda: ch.cancel_all(subs))
    results = await ch.join_prompts(request, subs, body.n)
    payload = base()
    payload["choices"] = []
    for p, result in enumerate(results):
        for j, choice in enumerate(result.choices):
            index = p * body.n + j
            text, logprobs = choice.text, None
            if shapers.active:
                text, logprobs = shapers.shape(index, choice.outputs, choice.text)
            payload["choices"].append(
                {
                    "index": index,
                    "text": text,
                    "finish_reason": choice.finish_reason,
                    "logprobs": logprobs,
                }
            )
    payload["usage"] = ch.total_usage(results, count_completion=not shapers.drops_sampled)
    return payload


async def chat(
    body: ChatCompletionRequest,
    request: Request,
    rid: str,
    route: Route,
    ids: list[int],
    max_tokens: int,
    constraint: ConstraintSpec | None = None,
) -> Any:
    params = gen.sampling_params(body, max_tokens, **chat_logprob_fields(body))
    subs = ch.submit_prompts(
        request,
        route,
        rid,
        [ids],
        lambda _: params,
        operation="chat",
        user=body.user,
        constraint=constraint,
        cache_salt=body.cache_salt,
    )
    base = _base(rid, subs[0].created, route.model, "chat.completion.chunk")
    logprobs = ChatChoiceLogprobs(route.engine.tokenizer, body)

    if body.stream:

        def chunk(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
            payload = base()
            delta = {"content": text} if text else {}
            payload["choices"] = [
                {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
            ]
            return payload

        def first(index: int) -> dict[str, Any]:
            payload = base()
            delta = {"role": "assistant", "content": ""}
            payload["choices"] = [
                {"index": index, "delta": delta, "finish_reason": None, "logprobs": None}
            ]
            return payload

        def rich(
            index: int, outputs: list[TokenOutput], text: str, finish_reason: str | None
        ) -> dict[str, Any]:
            payload = chunk(index, text, finish_reason)
            payload["choices"][0]["logprobs"] = logprobs.of(outputs)
            return payload

        usage = gen.usage_chunk_builder(base) if body.include_usage else None
        events = ch.choice_events(
            subs,
            body.n,
            chunk,
            first=first,
            usage=usage,
            continuous_usage=body.continuous_usage,
            rich=rich if logprobs.asked else None,
        )
        return EventStream(events, on_close=lambda: ch.cancel_all(subs))
    results = await ch.join_prompts(request, subs, body.n)
    payload = base()
    payload["object"] = "chat.completion"
    payload["choices"] = [
        {
            "index": j,
            "message": {"role": "assistant", "content": choice.text},
            "finish_reason": choice.finish_reason,
            "logprobs": logprobs.of(choice.outputs),
        }
        for j, choice in enumerate(results[0].choices)
    ]
    payload["usage"] = ch.total_usage(results)
    return payload


def _without_completion(
    build: Callable[[int, int, int], dict[str, Any]],
) -> Callable[[int, int, int], dict[str, Any]]:
    return lambda prompt, _completion, cached: build(prompt, 0, cached)
