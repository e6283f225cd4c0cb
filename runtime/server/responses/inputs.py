"""`instructions` + `input` -> the chat messages the model's template renders.

- a string is one user message;
- `message` items (with or without `type`): `developer` is the template's `system`; content is a
  string or `input_text` / `output_text` parts, joined with a newline (other part types, images
  and files, are a 400: this server runs text models);
- consecutive `function_call` items are one assistant turn with those tool calls (attached to the
  assistant message just before them, if any); `function_call_output` is a `tool` turn answering
  its `call_id`, which must name an earlier call;
- `reasoning` items are skipped (no reasoning model here); any other type is a 400 naming it.
`instructions` come first, as the system message, joined with the system / developer messages
that open the input (blank line between them).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.errors import InvalidRequestError
from runtime.server.openai.schemas import ChatMessage

__all__ = ["chat_messages", "input_turns"]

_TEXT_PARTS = {"input_text", "output_text", "text", "summary_text", "reasoning_text"}
_SKIPPED = {"reasoning"}


class _Item(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class _Part(_Item):
    type: str
    text: str | None = None


class _Message(_Item):
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | Annotated[list[_Part], Field(max_length=256)]


class _FunctionCall(_Item):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    arguments: str


class _FunctionCallOutput(_Item):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: str | Annotated[list[_Part], Field(max_length=256)]


_KINDS: dict[str, type[_Item]] = {
    "message": _Message,
    "function_call": _FunctionCall,
    "function_call_output": _FunctionCallOutput,
}


def _text(parts: str | list[_Part], where: str) -> str:
    if isinstance(parts, str):
        return parts
    texts = []
    for i, part in enumerate(parts):
        if part.type not in _TEXT_PARTS or part.text is None:
            raise InvalidRequestError(
                f"{where}.content[{i}]: part type {part.type[:64]!r} is not supported by this "
                "server (text models: input_text / output_text only)",
                param="input",
            )
        texts.append(part.text)
    return "\n".join(texts)


def _parse(index: int, raw: Any) -> _Item | None:
    where = f"input[{index}]"
    if not isinstance(raw, dict):
        raise InvalidRequestError(f"{where}: an item must be an object", param="input")
    kind = raw.get("type", "message")
    if kind in _SKIPPED:
        return None
    model = _KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        shown = kind[:64] if isinstance(kind, str) else type(kind).__name__
        raise InvalidRequestError(
            f"{where}: item type {shown!r} is not supported (message, function_call, "
            "function_call_output, reasoning)",
            param="input",
        )
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        raise InvalidRequestError(
            f"{where}.{loc}: {first.get('msg', 'invalid value')}", param="input"
        ) from None


def input_turns(
    items: str | list[dict[str, Any]], history: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The conversation's chat turns: a stored one's (`previous_response_id`), then the input's."""
    turns: list[dict[str, Any]] = [dict(t) for t in history or ()]
    if isinstance(items, str):
        return [*turns, {"role": "user", "content": items}]
    called = {c["id"] for t in turns for c in t.get("tool_calls") or ()}
    for index, raw in enumerate(items):
        item = _parse(index, raw)
        if isinstance(item, _Message):
            role = "system" if item.role == "developer" else item.role
            turns.append({"role": role, "content": _text(item.content, f"input[{index}]")})
        elif isinstance(item, _FunctionCall):
            function = {"name": item.name, "arguments": item.arguments}
            call = {"id": item.call_id, "function": function}
            last = turns[-1] if turns else None
            if last is not None and last["role"] == "assistant":
                last["tool_calls"] = [*(last.get("tool_calls") or ()), call]
            else:
                turns.append({"role": "assistant", "content": None, "tool_calls": [call]})
            called.add(item.call_id)
        elif isinstance(item, _FunctionCallOutput):
            if item.call_id not in called:
                raise InvalidRequestError(
                    f"input[{index}]: function_call_output answers call_id "
                    f"{item.call_id[:64]!r}, which no earlier function_call item has",
                    param="input",
                )
            content = _text(item.output, f"input[{index}]")
            turns.append({"role": "tool", "content": content, "tool_call_id": item.call_id})
    return turns


def chat_messages(instructions: str | None, turns: list[dict[str, Any]]) -> list[ChatMessage]:
    if not any(t["role"] != "system" for t in turns):
        raise InvalidRequestError("input has no message to respond to", param="input")
    system = [{"role": "system", "content": instructions}] if instructions else []
    return _validated([*system, *turns])


def _validated(turns: list[dict[str, Any]]) -> list[ChatMessage]:
    turns = list(turns)
    # `instructions` and leading system / developer messages are one system message: many
    # templates take a system message only first (others raise: a 400 for a valid request)
    while len(turns) > 1 and turns[0]["role"] == turns[1]["role"] == "system":
        turns[:2] = [
            {"role": "system", "content": f"{turns[0]['content']}\n\n{turns[1]['content']}"}
        ]
    try:
        return [ChatMessage.model_validate(t) for t in turns]
    except ValidationError as exc:  # e.g. more tool calls in one turn than chat takes
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        raise InvalidRequestError(f"input: {loc}: {first.get('msg')}", param="input") from None
