"""A Messages body -> the chat path's messages, prompt ids and sampling parameters.

- `system` (and any `system`-role message, in order) becomes the one leading system message;
- a user turn's `tool_result` blocks become `tool` messages (in block order, before or between
  its text), each naming the `tool_use` it answers, which an earlier assistant turn must hold;
- an assistant turn's `tool_use` blocks become its tool calls; `thinking` blocks are dropped;
- a last assistant turn of text only is a prefill: the prompt ends with its text and the reply
  continues it (Anthropic's behaviour), instead of a new assistant turn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from runtime.engine.constraints import ConstraintSpec
from runtime.engine.sampling import SamplingParams
from runtime.errors import InvalidRequestError
from runtime.models.tokenizer import Tokenizer
from runtime.server.anthropic.schemas import (
    CountTokensRequest,
    Message,
    MessagesRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from runtime.server.anthropic.tools import constraint_of, tool_plan
from runtime.server.openai.schemas import ChatMessage
from runtime.server.openai.tools import ToolPlan, render_chat_prompt
from runtime.server.prompts import encode_bounded

__all__ = ["Prompt", "build_prompt", "chat_messages", "clamp_max_tokens", "sampling_params"]

ERROR_PREFIX = "Error: "  # a tool_result with is_error, as the model reads it


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    plan: ToolPlan
    constraint: ConstraintSpec | None
    prefill: str  # the assistant text the prompt ends with ("" when none)


def build_prompt(body: CountTokensRequest, tokenizer: Tokenizer, room: int | None = None) -> Prompt:
    """`room`: the most prompt tokens the model takes; a prompt known to exceed it is refused
    before it is tokenized in full (runtime.server.prompts.encode_bounded; None: no bound)."""
    plan = tool_plan(body)
    constraint = constraint_of(body, plan)
    messages, prefill = chat_messages(body)
    text = render_chat_prompt(tokenizer, messages, plan) + prefill
    ids = encode_bounded(tokenizer, text, room=room, param="messages")
    return Prompt(ids, plan, constraint, prefill)


def chat_messages(body: CountTokensRequest) -> tuple[list[ChatMessage], str]:
    """(the chat messages, the prefill text)."""
    system = [body.system_text] if body.system_text else []
    turns: list[dict[str, Any]] = []
    tool_use_ids: set[str] = set()
    for i, message in enumerate(body.messages):
        if message.role == "system":
            system.append(_text_only(message, i))
        elif message.role == "assistant":
            turns.append(_assistant(message, i, tool_use_ids))
        else:
            turns.extend(_user(message, i, tool_use_ids))
    prefill = ""
    if turns and turns[-1]["role"] == "assistant" and not turns[-1].get("tool_calls"):
        prefill = turns.pop()["content"]
    if not turns:
        raise InvalidRequestError("messages: needs a user turn", param="messages")
    if system:
        turns.insert(0, {"role": "system", "content": "\n\n".join(system)})
    return [_chat_message(turn) for turn in turns], prefill


def _blocks(message: Message) -> list[Any]:
    if isinstance(message.content, str):
        return [TextBlock(type="text", text=message.content)]
    return list(message.content)


def _text_only(message: Message, index: int) -> str:
    blocks = _blocks(message)
    if any(not isinstance(b, TextBlock) for b in blocks if b.type not in _DROPPED):
        raise InvalidRequestError(
            f"messages[{index}]: a system message takes text blocks only", param="messages"
        )
    return "\n".join(b.text for b in blocks if isinstance(b, TextBlock))


_DROPPED = ("thinking", "redacted_thinking")


def _assistant(message: Message, index: int, tool_use_ids: set[str]) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in _blocks(message):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            tool_use_ids.add(block.id)
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": arguments},
                }
            )
        elif isinstance(block, ToolResultBlock):
            raise InvalidRequestError(
                f"messages[{index}]: tool_result blocks belong in a user turn", param="messages"
            )
    turn: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        turn["tool_calls"] = calls
    return turn


def _user(message: Message, index: int, tool_use_ids: set[str]) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    texts: list[str] = []
    for block in _blocks(message):
        if isinstance(block, ToolResultBlock):
            if block.tool_use_id not in tool_use_ids:
                raise InvalidRequestError(
                    f"messages[{index}]: tool_result names tool_use_id "
                    f"{block.tool_use_id[:64]!r}, which no earlier tool_use block has",
                    param="messages",
                )
            if texts:
                turns.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            content = ERROR_PREFIX + block.text if block.is_error else block.text
            turns.append({"role": "tool", "content": content, "tool_call_id": block.tool_use_id})
        elif isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            raise InvalidRequestError(
                f"messages[{index}]: tool_use blocks belong in an assistant turn", param="messages"
            )
    if texts or not turns:
        turns.append({"role": "user", "content": "\n".join(texts)})
    return turns


def _chat_message(turn: dict[str, Any]) -> ChatMessage:
    try:
        return ChatMessage.model_validate(turn)
    except ValidationError as exc:  # e.g. more tool calls in one turn than the chat path takes
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        raise InvalidRequestError(
            f"messages: {where}: {first.get('msg', 'invalid')}", param="messages"
        ) from exc


def clamp_max_tokens(engine: Any, num_prompt_tokens: int, asked: int) -> int:
    """`max_tokens` within the room the context (and the KV cache) leaves: Claude Code asks for
    32,000 on every turn whatever the model. Only a prompt with no room left is refused, in
    Anthropic's words (clients read them to compact their history)."""
    loaded = engine.loaded
    if not loaded.is_causal_lm:  # before its tiny context would make it "too long"
        raise InvalidRequestError(
            "this model is an embedding model; it cannot generate text", param="model"
        )
    context = int(loaded.args.max_position_embeddings)
    limit = context
    kv = engine.kv_cache_stats()
    if kv.num_pages and kv.page_size:
        limit = min(limit, kv.num_pages * kv.page_size)
    maximum = limit - 1  # one token of room at least
    if num_prompt_tokens > maximum:
        raise InvalidRequestError(
            f"prompt is too long: {num_prompt_tokens} tokens > {maximum} maximum", param="messages"
        )
    return max(1, min(asked, limit - num_prompt_tokens))


def sampling_params(body: MessagesRequest, max_tokens: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p if body.top_p is not None else 1.0,
        top_k=body.top_k or 0,
        stop=tuple(body.stop_sequences or ()),
    )
