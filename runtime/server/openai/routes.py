"""The OpenAI-compatible API: completions, chat completions, embeddings, models."""

from __future__ import annotations

import asyncio
import base64
import struct
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from runtime.engine.request import TokenOutput
from runtime.errors import InvalidRequestError
from runtime.server.errors import ERROR_RESPONSES
from runtime.server.openai import batched
from runtime.server.openai import generate as gen
from runtime.server.openai.controls import (
    chat_logprob_fields,
    completion_logprob_fields,
    scored_max_tokens,
)
from runtime.server.openai.logprobs import (
    TokenTexts,
    chat_logprobs,
    completion_shaper,
    sampled_positions,
)
from runtime.server.openai.schemas import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    ModelCard,
    ModelList,
)
from runtime.server.openai.streaming import EventStream, token_events
from runtime.server.openai.structured import constraint_of
from runtime.server.openai.tools import plan_tools, render_chat_prompt
from runtime.server.openai.tools.response import assistant_message, chat_constraint
from runtime.server.openai.tools.stream import tool_events
from runtime.server.state import get_state

router = APIRouter(prefix="/v1", tags=["openai"])

_STREAMED: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the completion, or with `stream: true` server-sent events",
        "content": {
            "text/event-stream": {
                # one server-sent event: `data` is a chunk's JSON, an error's JSON, or "[DONE]"
                "schema": {
                    "type": "object",
                    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
                    "required": ["data"],
                }
            }
        },
    }
}
COMPLETION_DEFAULT_MAX_TOKENS = 16
CHAT_DEFAULT_MAX_TOKENS = 256


@router.post(
    "/completions", response_model=CompletionResponse, responses={**ERROR_RESPONSES, **_STREAMED}
)
async def create_completion(body: CompletionRequest, request: Request) -> Any:
    rid = gen.begin(request, "cmpl", body.model, "text_completion")
    route = get_state(request).router.pick(body.model, user=body.user)
    if not batched.is_plain(body):  # a prompt batch, n / best_of, per-chunk usage
        return await batched.completions(
            body, request, rid, route, COMPLETION_DEFAULT_MAX_TOKENS, constraint_of(body)
        )
    prompt = body.single_prompt
    ids = route.engine.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    max_tokens = scored_max_tokens(body) or gen.default_max_tokens(
        route.engine, len(ids), COMPLETION_DEFAULT_MAX_TOKENS
    )
    params = gen.sampling_params(body, max_tokens, **completion_logprob_fields(body))
    spec = constraint_of(body)  # structured output (runtime.server.openai.structured)
    sub = gen.submit(
        request,
        route,
        rid,
        ids,
        params,
        operation="text_completion",
        user=body.user,
        constraint=spec,
        cache_salt=body.cache_salt,
    )
    shaper = completion_shaper(route.engine.tokenizer, prompt, ids, body)

    def base() -> dict[str, Any]:
        return {
            "id": rid,
            "object": "text_completion",
            "created": sub.created,
            "model": route.model,
        }

    if body.stream:

        def chunk(text: str, finish_reason: str | None) -> dict[str, Any]:
            payload = base()
            payload["choices"] = [
                {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
            ]
            return payload

        def rich(outputs: list[TokenOutput], text: str, finish_reason: str | None) -> Any:
            payload = base()
            text, logprobs = shaper.shape(outputs, text)
            payload["choices"] = [
                {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}
            ]
            return payload

        usage = gen.usage_chunk_builder(base) if body.include_usage else None
        if usage is not None and shaper.drop_sampled:  # max_tokens 0: nothing is returned
            usage = _without_completion(usage)
        plain = not body.echo and body.logprobs is None
        events = token_events(
            sub.handle, sub.cancel, chunk, usage=usage, rich=None if plain else rich
        )
        return EventStream(events, on_close=sub.cancel)
    out = await gen.join(request, sub)
    payload = base()
    text, logprobs = shaper.shape([out], out.text)
    payload["choices"] = [
        {"index": 0, "text": text, "finish_reason": out.finished_reason, "logprobs": logprobs}
    ]
    completion_tokens = 0 if shaper.drop_sampled else out.completion_tokens
    payload["usage"] = gen.usage(out.prompt_tokens, completion_tokens, out.cached_tokens)
    return payload


@router.post(
    "/chat/completions",
    response_model=ChatCompletionResponse,
    responses={**ERROR_RESPONSES, **_STREAMED},
)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Any:
    rid = gen.begin(request, "chatcmpl", body.model, "chat")
    route = get_state(request).router.pick(body.model, user=body.user)
    tokenizer = route.engine.tokenizer
    plan = plan_tools(body)  # tools and tool_choice (runtime.server.openai.tools)
    constraint = chat_constraint(body, plan)
    ids = tokenizer.encode(render_chat_prompt(tokenizer, body.messages, plan))
    max_tokens = (
        body.max_completion_tokens
        or body.max_tokens
        or gen.default_max_tokens(route.engine, len(ids), CHAT_DEFAULT_MAX_TOKENS)
    )
    if not batched.is_plain(body):  # n choices, per-chunk usage
        if plan.is_offered:
            raise InvalidRequestError(
                "tools with n > 1 or per-chunk usage are not supported yet; send n = 1",
                param="n" if body.n != 1 else "stream_options",
            )
        return await batched.chat(body, request, rid, route, ids, max_tokens, constraint)
    params = gen.sampling_params(body, max_tokens, **chat_logprob_fields(body))
    sub = gen.submit(
        request,
        route,
        rid,
        ids,
        params,
        operation="chat",
        user=body.user,
        constraint=constraint,
        cache_salt=body.cache_salt,
    )
    texts = TokenTexts(tokenizer, body.return_tokens_as_token_ids)

    def base() -> dict[str, Any]:
        return {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": sub.created,
            "model": route.model,
        }

    if body.stream and plan.is_offered:
        usage = gen.usage_chunk_builder(base) if body.include_usage else None
        events = tool_events(sub.handle, sub.cancel, plan, base, usage=usage)
        return EventStream(events, on_close=sub.cancel)
    if body.stream:

        def chunk(text: str, finish_reason: str | None) -> dict[str, Any]:
            payload = base()
            delta = {"content": text} if text else {}
            payload["choices"] = [
                {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
            ]
            return payload

        first = base()
        first["choices"] = [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "finish_reason": None,
                "logprobs": None,
            }
        ]

        def rich(outputs: list[TokenOutput], text: str, finish_reason: str | None) -> Any:
            payload = chunk(text, finish_reason)
            logprobs = chat_logprobs(texts, sampled_positions(outputs))
            payload["choices"][0]["logprobs"] = logprobs
            return payload

        usage = gen.usage_chunk_builder(base) if body.include_usage else None
        events = token_events(
            sub.handle,
            sub.cancel,
            chunk,
            first=first,
            usage=usage,
            rich=rich if body.logprobs else None,
        )
        return EventStream(events, on_close=sub.cancel)
    out = await gen.join(request, sub)
    payload = base()
    payload["object"] = "chat.completion"
    message, finish_reason = assistant_message(plan, out.text, out.finished_reason)
    payload["choices"] = [
        {
            "index": 0,
            "message": message,
            "finish_reason": finish_reason,
            "logprobs": chat_logprobs(texts, sampled_positions([out])) if body.logprobs else None,
        }
    ]
    payload["usage"] = gen.usage(out.prompt_tokens, out.completion_tokens, out.cached_tokens)
    return payload


@router.post("/embeddings", response_model=EmbeddingResponse, responses=ERROR_RESPONSES)
async def create_embeddings(body: EmbeddingRequest, request: Request) -> Any:
    rid = gen.begin(request, "embd", body.model, "embeddings")
    route = get_state(request).router.pick(body.model, user=body.user)
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    if any(not text for text in texts):
        raise InvalidRequestError("input strings must not be empty", param="input")
    result = await asyncio.to_thread(route.engine.embed, texts, request_id=rid)
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(vector, body.encoding_format)}
        for i, vector in enumerate(result.embeddings)
    ]
    total = result.total_prompt_tokens
    return {
        "object": "list",
        "data": data,
        "model": route.model,
        "usage": {"prompt_tokens": total, "completion_tokens": 0, "total_tokens": total},
    }


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":  # what the openai client asks for by default
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


@router.get("/models", response_model=ModelList, responses=ERROR_RESPONSES)
async def list_models(request: Request) -> Response | ModelList:
    state = get_state(request)
    cards = [ModelCard(id=name, created=state.created) for name in state.router.model_names]
    return ModelList(data=cards)


def _without_completion(
    build: Callable[[int, int, int], dict[str, Any]],
) -> Callable[[int, int, int], dict[str, Any]]:
    return lambda prompt, _completion, cached: build(prompt, 0, cached)
