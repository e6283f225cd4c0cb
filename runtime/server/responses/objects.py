"""The response object and its output items (the field set of the `openai` SDK's `Response`).

`Draft` holds what every snapshot of one response repeats (its id, time, and the request's
settings); `outcome` decides, from the finished text, which output items there are: a message,
function calls, or both. The streamed and the joined response both go through `outcome`, so a
stream's items are the final object's items.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from runtime.engine.request import TokenOutput
from runtime.engine.stats import FinishReason
from runtime.server.openai.tools import ToolPlan, parse_tool_calls
from runtime.server.openai.tools.parse import OPEN_TAG, new_call_id
from runtime.server.responses.schemas import ResponsesRequest
from runtime.server.responses.tools import ResponseTools

__all__ = ["Call", "Draft", "Outcome", "call_item", "message_item", "outcome", "usage"]


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Call:
    call_id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class Outcome:
    text: str | None  # the assistant message's text; None: no message item
    calls: list[Call]


def outcome(plan: ToolPlan, text: str, reason: str | None, parallel: bool) -> Outcome:
    """Output items of a finished text. A forced function (`named`) is always a call, even when
    cut short (then an incomplete one); `required` and `auto` output is calls only when it
    finished and parses into some, with any text before the first call as the message."""
    if plan.mode == "named" and plan.name is not None:
        return Outcome(None, [Call(new_call_id(), plan.name, text)])
    if not plan.is_offered or reason != FinishReason.STOP:
        return Outcome(text, [])
    parsed = parse_tool_calls(plan, text)
    if not parsed.tool_calls:
        return Outcome(text, [])
    calls = [
        Call(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in parsed.tool_calls
    ]
    before = text[: text.index(OPEN_TAG)] if plan.mode == "auto" else ""
    return Outcome(before if before.strip() else None, calls if parallel else calls[:1])


def status_of(reason: str | None) -> str:
    return "incomplete" if reason == FinishReason.LENGTH else "completed"


def text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def message_item(
    id_: str, text: str | None, status: str, logprobs: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    content = [] if text is None else [text_part(text, logprobs)]
    return {"id": id_, "type": "message", "role": "assistant", "status": status, "content": content}


def call_item(id_: str, call: Call, status: str, namespace: str | None = None) -> dict[str, Any]:
    item = {
        "id": id_,
        "type": "function_call",
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }
    if namespace:
        item["namespace"] = namespace
    return item


def usage(out: TokenOutput) -> dict[str, Any]:
    """`cached_tokens`: prompt tokens whose KV the prefix cache supplied (part of input_tokens)."""
    return {
        "input_tokens": out.prompt_tokens,
        "input_tokens_details": {"cached_tokens": out.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": out.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": out.prompt_tokens + out.completion_tokens,
    }


@dataclass
class Draft:
    """What every snapshot of one response repeats: identity and the request's settings."""

    id: str
    created_at: int
    model: str
    body: ResponsesRequest
    tools: ResponseTools

    @property
    def parallel_tool_calls(self) -> bool:
        return self.body.parallel_tool_calls is not False

    def snapshot(
        self,
        status: str,
        output: list[dict[str, Any]],
        *,
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        completed_at: int | None = None,
    ) -> dict[str, Any]:
        body = self.body
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        text = body.text.format.echo() if body.text is not None else {"type": "text"}
        verbosity = body.text.verbosity if body.text is not None else None
        payload: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": completed_at,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": body.max_tool_calls,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": self.parallel_tool_calls,
            "previous_response_id": body.previous_response_id,
            "prompt_cache_key": body.prompt_cache_key,
            "reasoning": body.reasoning or {"effort": None, "summary": None},
            "safety_identifier": body.safety_identifier,
            "service_tier": body.service_tier or "default",
            "store": body.store is True,  # true only where the server stores it
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": {"format": text, "verbosity": verbosity or "medium"},
            "tool_choice": body.tool_choice or "auto",
            "tools": self.tools.echoed,
            "top_logprobs": body.top_logprobs or 0,
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "truncation": body.truncation or "disabled",
            "usage": usage,
            "user": body.user,
            "metadata": body.metadata or {},
            "background": False,
        }
        if self.tools.warnings:  # hosted tools left out (runtime.server.responses.tools)
            payload["warnings"] = list(self.tools.warnings)
        return payload
