"""POST /v1/responses: OpenAI's Responses API on the chat path (stateless).

The body becomes chat messages (inputs.py), a ToolPlan and one constraint (tools.py), then runs
as one engine request like a chat completion (runtime.server.openai.generate), observed as
operation `responses`. With the server's database (storage_enabled), `store: true` keeps a
response and `previous_response_id` continues it (stored.py; GET / DELETE below); without it
they are 400s that say so, as are `conversation` and `background: true` always.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from fastapi import APIRouter, Request

from runtime.engine.sampling import SamplingParams
from runtime.errors import InvalidRequestError
from runtime.server.errors import ERROR_RESPONSES
from runtime.server.openai import generate as gen
from runtime.server.openai.logprobs import TokenTexts, chat_logprobs, sampled_positions
from runtime.server.openai.streaming import EventStream
from runtime.server.openai.tools import render_chat_prompt
from runtime.server.prompts import message_chars, render_and_encode, room_for
from runtime.server.responses.events import Saver, response_events
from runtime.server.responses.inputs import chat_messages, input_turns
from runtime.server.responses.objects import (
    Draft,
    call_item,
    item_id,
    message_item,
    outcome,
    status_of,
    usage,
)
from runtime.server.responses.schemas import ResponsesRequest
from runtime.server.responses.stored import ResponseNotFound, Storage, storage_of
from runtime.server.responses.tools import response_constraint, response_tools
from runtime.server.state import get_state

router = APIRouter(prefix="/v1", tags=["responses"])

_STREAMED: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the response object, or with `stream: true` typed server-sent events",
        "content": {
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
                    "required": ["event", "data"],
                }
            }
        },
    }
}
_NO_STORE = "this server keeps no responses (storage_enabled is off)"


def _refuse_state(body: ResponsesRequest, storage: Storage | None) -> None:
    if storage is None:
        if body.store:
            raise InvalidRequestError(
                f"store: true is not supported: {_NO_STORE}; send store: false or leave it out",
                param="store",
            )
        if body.previous_response_id is not None:
            raise InvalidRequestError(
                f"previous_response_id is not supported: {_NO_STORE}; send the whole "
                "conversation as input",
                param="previous_response_id",
            )
    if body.conversation is not None:
        raise InvalidRequestError(
            "conversation is not supported; use previous_response_id or send the whole "
            "conversation as input",
            param="conversation",
        )
    if body.background:
        raise InvalidRequestError("background: true is not supported", param="background")


@router.post("/responses", responses={**ERROR_RESPONSES, **_STREAMED})
async def create_response(body: ResponsesRequest, request: Request) -> Any:
    rid = gen.begin(request, "resp", body.model, "responses")
    # one id for the API object, the engine request, its span and its inference_log row
    rid = request.state.request_id = "resp_" + rid.removeprefix("resp-")
    storage = storage_of(request)
    _refuse_state(body, storage)
    route = get_state(request).router.pick(body.model, user=body.user)
    tokenizer = route.engine.tokenizer
    tools = response_tools(body)
    constraint = response_constraint(body, tools.plan)
    history: list[dict[str, Any]] = []
    if storage is not None and body.previous_response_id is not None:
        history = await storage.history(body.previous_response_id)
    turns = input_turns(body.input, history)
    messages = chat_messages(body.instructions, turns)
    render = partial(render_chat_prompt, tokenizer, messages, tools.plan)
    room = room_for(route.engine)  # rendered and encoded off the loop
    ids = await render_and_encode(
        tokenizer, render, message_chars(messages), room=room, param="input"
    )
    context = int(route.engine.loaded.args.max_position_embeddings)
    max_tokens = body.max_output_tokens or gen.default_max_tokens(route.engine, len(ids), context)
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        logprobs=(body.top_logprobs or 0) if body.wants_logprobs else None,
    )
    try:
        sub = gen.submit(
            request,
            route,
            rid,
            ids,
            params,
            operation="responses",
            user=body.user,
            constraint=constraint,
            priority=body.priority,
        )
    except InvalidRequestError as exc:  # the engine names completions' fields
        exc.param = {"max_tokens": "max_output_tokens", "prompt": "input"}.get(
            exc.param or "", exc.param
        )
        raise
    draft = Draft(rid, sub.created, route.model, body, tools)
    texts = TokenTexts(tokenizer) if body.wants_logprobs else None
    save: Saver | None = None
    if storage is not None and body.store:
        save = partial(storage.save, turns=turns, model=route.model)
    if body.stream:
        events = response_events(sub.handle, sub.cancel, draft, texts, on_final=save)
        return EventStream(events, on_close=sub.cancel)
    out = await gen.join(request, sub)
    result = outcome(tools.plan, out.text, out.finished_reason, draft.parallel_tool_calls)
    status = status_of(out.finished_reason)
    output: list[dict[str, Any]] = []
    if result.text is not None:
        logprobs = None
        if texts is not None:
            logprobs = chat_logprobs(texts, sampled_positions([out]))["content"]
        output.append(message_item(item_id("msg"), result.text, status, logprobs))
    for call in result.calls:
        namespace = tools.namespaces.get(call.name)
        output.append(call_item(item_id("fc"), call, status, namespace))
    completed_at = int(time.time()) if status == "completed" else None
    snapshot = draft.snapshot(status, output, usage=usage(out), completed_at=completed_at)
    if save is not None:
        await save(snapshot)
    if out.metrics is not None:  # enable_request_metrics (not stored with the response)
        snapshot = {**snapshot, "metrics": out.metrics.as_dict()}
    return snapshot


@router.get("/responses/{response_id}", responses=ERROR_RESPONSES)
async def get_response(response_id: str, request: Request) -> Any:
    return await _storage(request).get(response_id)


@router.delete("/responses/{response_id}", responses=ERROR_RESPONSES)
async def delete_response(response_id: str, request: Request) -> Any:
    await _storage(request).delete(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


def _storage(request: Request) -> Storage:
    storage = storage_of(request)
    if storage is None:
        raise ResponseNotFound(f"no response is stored: {_NO_STORE}", param="id")
    return storage
