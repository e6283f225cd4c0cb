"""A finished output -> the Message's content blocks, stop_reason and usage.

stop_reason: `tool_use` when tools were offered and the output parses into calls (as the chat
path parses them: runtime.server.openai.tools.parse), `max_tokens` at the length limit,
`stop_sequence` when one of the body's stop_sequences ended it (the engine leaves the matched
text out; the decoded tokens still hold it, and the earliest match is the one that stopped it),
else `end_turn`.

usage follows Anthropic's split: `input_tokens` are the prompt tokens computed for this request,
`cache_read_input_tokens` those whose KV the prefix cache supplied (their sum is the prompt, as
count_tokens counts it); nothing is written to a cache on request, so
`cache_creation_input_tokens` is 0.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runtime.models.tokenizer import Tokenizer
from runtime.server.openai.tools import ToolPlan, parse_tool_calls

__all__ = ["Outcome", "message_id", "outcome", "stop_of", "tool_use_id", "usage"]


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class Outcome:
    content: list[dict[str, Any]]  # text and tool_use blocks
    stop_reason: str
    stop_sequence: str | None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "output_tokens": completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
    }


def tool_calls(plan: ToolPlan, text: str) -> tuple[str, list[dict[str, Any]]]:
    """(text besides the calls, tool_use blocks); no blocks when the text holds no call."""
    if not plan.is_offered:
        return text, []
    parsed = parse_tool_calls(plan, text)
    blocks = []
    for call in parsed.tool_calls:
        arguments = json.loads(call["function"]["arguments"])
        if not isinstance(arguments, dict):  # Anthropic's input is an object
            return text, []
        blocks.append(
            {
                "type": "tool_use",
                "id": tool_use_id(),
                "name": call["function"]["name"],
                "input": arguments,
            }
        )
    return (parsed.content or "") if blocks else text, blocks


def stop_of(
    finished_reason: str | None,
    token_ids: Sequence[int],
    stop_sequences: Sequence[str],
    tokenizer: Tokenizer,
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of an output that ended without tool calls."""
    if finished_reason == "length":
        return "max_tokens", None
    if stop_sequences:
        decoded = tokenizer.decode(list(token_ids))
        found = [(decoded.find(s), s) for s in stop_sequences if s in decoded]
        if found:
            return "stop_sequence", min(found)[1]
    return "end_turn", None


def outcome(
    plan: ToolPlan,
    text: str,
    finished_reason: str | None,
    stop: tuple[str, str | None],
) -> Outcome:
    """`stop`: stop_of's answer, used when the output is no tool call."""
    content, calls = tool_calls(plan, text) if finished_reason == "stop" else (text, [])
    blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
    if calls:
        return Outcome(blocks + calls, "tool_use", None)
    return Outcome(blocks, *stop)
