"""`POST /v1/messages` and `POST /v1/messages/count_tokens` (a query string such as
`?beta=true` is ignored, as are `anthropic-version` and `anthropic-beta`).

A message runs as one chat request of operation `messages` (its span's gen_ai.operation.name,
its RequestStats and inference_log row): same route pick, tenant, prefix-cache salt and
cancellation on disconnect as /v1/chat/completions (runtime.server.openai.generate).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from runtime.models.tokenizer import Tokenizer
from runtime.server.anthropic import reply
from runtime.server.anthropic.openapi import (
    COUNT_RESPONSES,
    MESSAGE_RESPONSES,
    CountTokens,
    MessageResponse,
)
from runtime.server.anthropic.schemas import CountTokensRequest, MessagesRequest
from runtime.server.anthropic.stream import message_events
from runtime.server.anthropic.translate import (
    Prompt,
    build_prompt,
    clamp_max_tokens,
    sampling_params,
)
from runtime.server.offload import off_loop
from runtime.server.openai import generate as gen
from runtime.server.openai.streaming import EventStream
from runtime.server.prompts import needs_pool, room_for
from runtime.server.state import get_state

router = APIRouter(prefix="/v1", tags=["anthropic"])
OPERATION = "messages"  # gen_ai.operation.name


@router.post("/messages", response_model=MessageResponse, responses=MESSAGE_RESPONSES)
async def create_message(body: MessagesRequest, request: Request) -> Any:
    request_id = gen.begin(request, "msg", body.model, OPERATION)
    route = get_state(request).router.pick(body.model, user=body.user)
    tokenizer = route.engine.tokenizer
    prompt = await _build_prompt(request, body, tokenizer, room_for(route.engine))
    max_tokens = clamp_max_tokens(route.engine, len(prompt.ids), body.max_tokens)
    sub = gen.submit(
        request,
        route,
        request_id,
        prompt.ids,
        sampling_params(body, max_tokens),
        operation=OPERATION,
        user=body.user,
        constraint=prompt.constraint,
        priority=body.priority,
    )
    message_id = "msg_" + request_id.removeprefix("msg-")
    stops = body.stop_sequences or []

    def message(
        content: list[dict[str, Any]], stop: tuple[str | None, str | None]
    ) -> dict[str, Any]:
        return {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": route.model,
            "content": content,
            "stop_reason": stop[0],
            "stop_sequence": stop[1],
        }

    if body.stream:
        start = message([], (None, None))
        start["usage"] = reply.usage(len(prompt.ids), 0, 0)
        events = message_events(sub.handle, sub.cancel, start, prompt.plan, tokenizer, stops)
        return EventStream(events, on_close=sub.cancel)
    out = await gen.join(request, sub)
    stop = reply.stop_of(out.finished_reason, out.token_ids, stops, tokenizer)
    result = reply.outcome(prompt.plan, out.text, out.finished_reason, stop)
    payload = message(result.content, (result.stop_reason, result.stop_sequence))
    payload["usage"] = reply.usage(out.prompt_tokens, out.completion_tokens, out.cached_tokens)
    if out.metrics is not None:  # enable_request_metrics
        payload["metrics"] = out.metrics.as_dict()
    return JSONResponse(payload)  # as built: the response model only documents it


@router.post("/messages/count_tokens", response_model=CountTokens, responses=COUNT_RESPONSES)
async def count_tokens(body: CountTokensRequest, request: Request) -> Any:
    request.state.model = body.model
    request.state.operation = OPERATION
    route = get_state(request).router.pick(body.model)
    prompt = await _build_prompt(request, body, route.engine.tokenizer)
    return JSONResponse({"input_tokens": len(prompt.ids)})


async def _build_prompt(
    request: Request, body: CountTokensRequest, tokenizer: Tokenizer, room: int | None = None
) -> Prompt:
    """Rendered and encoded off the event loop unless the body is short and the template ours
    (runtime.server.prompts.needs_pool; the body's length stands for its messages')."""
    size = int(request.headers.get("content-length") or 0)
    if needs_pool(tokenizer, size):
        return await off_loop(build_prompt, body, tokenizer, room)
    return build_prompt(body, tokenizer, room)
