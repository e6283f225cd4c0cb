"""The OpenAI-compatible API: completions, chat completions, embeddings, models.

One handler per endpoint serves one prompt or a batch, one choice or `n` / `best_of`: a plain
body runs one engine request (runtime.server.openai.generate.Single), the others
runtime.server.openai.choices. Each feature module (logprobs, controls, structured, tools,
choices) runs only behind the body's flag (runtime.server.openai.features), so a plain request
pays for none of them.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import struct
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from runtime.engine.constraints import ConstraintSpec
from runtime.engine.sampling import SamplingParams
from runtime.errors import InvalidRequestError
from runtime.server.errors import ERROR_RESPONSES
from runtime.server.offload import json_response
from runtime.server.openai import choices
from runtime.server.openai import generate as gen
from runtime.server.openai.batch_fit import check_batch_fits, check_prompts_fit
from runtime.server.openai.choice_logprobs import ChatChoiceLogprobs, CompletionChoiceShapers
from runtime.server.openai.chunks import STREAMED, chunker, rich_chunker
from runtime.server.openai.controls import (
    chat_logprob_fields,
    completion_logprob_fields,
    scored_max_tokens,
)
from runtime.server.openai.replies import (
    ChatCompletionResponse,
    CompletionResponse,
    EmbeddingResponse,
    ModelCard,
    ModelList,
)
from runtime.server.openai.response_size import chat_shape, check_response_size, completion_shape
from runtime.server.openai.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from runtime.server.openai.streaming import EventStream
from runtime.server.openai.structured import constraint_of
from runtime.server.openai.tools import ToolPlan, plan_tools, render_chat_prompt
from runtime.server.openai.tools.response import assistant_message, chat_constraint
from runtime.server.openai.tools.stream import tool_events
from runtime.server.prompts import encode_prompt, message_chars, render_and_encode, room_for
from runtime.server.state import get_state
from runtime.serving.router import Route

router = APIRouter(prefix="/v1", tags=["openai"])

COMPLETION_DEFAULT_MAX_TOKENS = 16
CHAT_DEFAULT_MAX_TOKENS = 256


@router.post(
    "/completions", response_model=CompletionResponse, responses={**ERROR_RESPONSES, **STREAMED}
)
async def create_completion(body: CompletionRequest, request: Request) -> Any:
    rid = gen.begin(request, "cmpl", body.model, "text_completion")
    route = get_state(request).router.pick(body.model, user=body.user)
    asks = body.features  # runtime.server.openai.features: what runs besides the plain path
    tokenizer = route.engine.tokenizer
    # max_tokens 0 scores an echoed prompt (runtime.server.openai.controls.scored_max_tokens)
    max_tokens = scored_max_tokens(body) if body.max_tokens == 0 else body.max_tokens
    room = room_for(route.engine)  # long prompts: bounded, then off the loop
    prompts = [
        await encode_prompt(tokenizer, p, room=room) if isinstance(p, str) else list(p)
        for p in body.prompts
    ]
    heavy = asks.logprobs or asks.choices  # a large response is built off the loop, bounded
    if heavy and not body.stream:
        shape = completion_shape(
            body.prompts,
            prompts,
            n=body.n,
            max_tokens=max_tokens or 1,
            echo=body.echo,
            logprobs=body.logprobs if asks.logprobs else None,
        )
        check_response_size(shape, get_state(request).settings.max_response_bytes)
    logprob_fields = completion_logprob_fields(body) if asks.logprobs else {}

    def params(ids: list[int]) -> SamplingParams:
        limit = max_tokens or gen.default_max_tokens(
            route.engine, len(ids), COMPLETION_DEFAULT_MAX_TOKENS
        )
        return gen.sampling_params(body, limit, **logprob_fields)

    constraint = constraint_of(body) if asks.structured else None
    run = _start(request, route, rid, prompts, params, body, "text_completion", constraint)
    base = _base(rid, run.created, route.model, "text_completion")
    shapers = None  # echo and logprobs (runtime.server.openai.choice_logprobs)
    if asks.logprobs and (body.echo or body.logprobs is not None):
        shapers = CompletionChoiceShapers(tokenizer, body, prompts)
    counted = body.max_tokens != 0  # max_tokens 0: the sampled token is left out, not counted
    if body.stream:
        chunk = chunker(base, lambda text: {"text": text})
        rich = None if shapers is None else rich_chunker(chunk, shapers.shape)
        usage = gen.usage_chunk_builder(base, counted) if body.include_usage else None
        events = run.events(gen.Chunks(chunk, usage=usage, rich=rich))
        return EventStream(events, on_close=run.cancel)
    joined = await run.join(request)

    def choice(c: gen.Finished) -> dict[str, Any]:
        text, logprobs = (
            (c.text, None) if shapers is None else shapers.shape(c.index, c.outputs, c.text)
        )
        return {
            "index": c.index,
            "text": text,
            "finish_reason": c.finish_reason,
            "logprobs": logprobs,
        }

    def build() -> dict[str, Any]:
        payload = base()
        payload["choices"] = [choice(c) for c in joined.choices]
        payload["usage"] = joined.usage(counted)
        if joined.metrics is not None:  # enable_request_metrics
            payload["metrics"] = joined.metrics.as_dict()
        return payload

    return await json_response(build) if heavy else build()


@router.post(
    "/chat/completions",
    response_model=ChatCompletionResponse,
    responses={**ERROR_RESPONSES, **STREAMED},
)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Any:
    rid = gen.begin(request, "chatcmpl", body.model, "chat")
    route = get_state(request).router.pick(body.model, user=body.user)
    asks = body.features  # runtime.server.openai.features: what runs besides the plain path
    tokenizer = route.engine.tokenizer
    plan: ToolPlan | None = None
    constraint: ConstraintSpec | None = None
    if asks.tools:  # tools and tool_choice (runtime.server.openai.tools)
        plan = plan_tools(body)
        constraint = chat_constraint(body, plan)
        render = functools.partial(render_chat_prompt, tokenizer, body.messages, plan)
    else:
        constraint = constraint_of(body) if asks.structured else None
        render = functools.partial(tokenizer.apply_chat_template, [m.turn for m in body.messages])
    # rendered and encoded off the loop unless short with the built-in template
    room = room_for(route.engine)
    chars = message_chars(body.messages)
    ids = await render_and_encode(tokenizer, render, chars, room=room)
    max_tokens = (
        body.max_completion_tokens
        or body.max_tokens
        or gen.default_max_tokens(route.engine, len(ids), CHAT_DEFAULT_MAX_TOKENS)
    )
    offered = plan is not None and plan.is_offered
    if asks.choices and offered:
        raise InvalidRequestError(
            "tools with n > 1 or per-chunk usage are not supported yet; send n = 1",
            param="n" if body.n != 1 else "stream_options",
        )
    params = gen.sampling_params(
        body, max_tokens, **(chat_logprob_fields(body) if asks.logprobs else {})
    )
    heavy = asks.logprobs or asks.choices  # a large response is built off the loop, bounded
    if heavy and not body.stream:
        shape = chat_shape(
            n=body.n, max_tokens=max_tokens, logprobs=body.logprobs, top_logprobs=body.top_logprobs
        )
        check_response_size(shape, get_state(request).settings.max_response_bytes)
    run = _start(request, route, rid, [ids], lambda _: params, body, "chat", constraint)
    base = _base(rid, run.created, route.model, "chat.completion.chunk")
    logprobs = ChatChoiceLogprobs(tokenizer, body) if asks.logprobs and body.logprobs else None
    if body.stream:
        usage = gen.usage_chunk_builder(base) if body.include_usage else None
        if plan is not None and offered:
            assert isinstance(run, gen.Single)  # tools are refused with several choices
            sub = run.submitted
            events = tool_events(sub.handle, sub.cancel, plan, base, usage=usage)
            return EventStream(events, on_close=run.cancel)
        chunk = chunker(base, lambda text: {"delta": {"content": text} if text else {}})
        rich = None
        if logprobs is not None:
            rich = rich_chunker(chunk, lambda _, outputs, text: (text, logprobs.of(outputs)))
        first = chunker(base, lambda _: {"delta": {"role": "assistant", "content": ""}})
        events = run.events(gen.Chunks(chunk, lambda i: first(i, "", None), usage, rich))
        return EventStream(events, on_close=run.cancel)
    joined = await run.join(request)

    def choice(c: gen.Finished) -> dict[str, Any]:
        message = {"role": "assistant", "content": c.text}
        reason = c.finish_reason
        if plan is not None:
            message, reason = assistant_message(plan, c.text, c.finish_reason)
        lp = None if logprobs is None else logprobs.of(c.outputs)
        return {"index": c.index, "message": message, "finish_reason": reason, "logprobs": lp}

    def build() -> dict[str, Any]:
        payload = base()
        payload["object"] = "chat.completion"
        payload["choices"] = [choice(c) for c in joined.choices]
        payload["usage"] = joined.usage()
        if joined.metrics is not None:  # enable_request_metrics
            payload["metrics"] = joined.metrics.as_dict()
        return payload

    return await json_response(build) if heavy else build()


def _start(
    request: Request,
    route: Route,
    rid: str,
    prompts: list[list[int]],
    params: Callable[[list[int]], SamplingParams],
    body: CompletionRequest | ChatCompletionRequest,
    operation: str,
    constraint: ConstraintSpec | None,
) -> gen.Run:
    """One engine request for a plain body; runtime.server.openai.choices for the others."""
    submit = functools.partial(
        gen.submit,
        request,
        route,
        operation=operation,
        user=body.user,
        constraint=constraint,
        cache_salt=body.cache_salt,
        priority=body.priority,
        speculative=body.speculative,
    )
    if body.features.choices:
        # the whole batch must be able to queue before any prompt of it is
        settings = get_state(request).settings
        check_batch_fits(route.engine, settings, prompts, params(prompts[0]).num_seqs)
        check_prompts_fit(route.engine, prompts, lambda ids: params(ids).max_tokens)
        best_of = getattr(body, "best_of", None)  # completions only
        return choices.start(
            submit,
            rid,
            prompts,
            params,
            n=body.n,
            best_of=best_of,
            stream=body.stream,
            continuous_usage=body.continuous_usage,
        )
    return gen.Single(submit(rid, prompts[0], params(prompts[0])))


def _base(rid: str, created: int, model: str, obj: str) -> Callable[[], dict[str, Any]]:
    return lambda: {"id": rid, "object": obj, "created": created, "model": model}


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
    cards += [
        ModelCard(id=name, created=state.created, parent=parent)
        for name, parent in sorted(state.router.adapters.items())
    ]
    return ModelList(data=cards)
