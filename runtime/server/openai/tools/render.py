"""The chat prompt with tools: the model's own template when it takes `tools` (its source
mentions them), else this server's system-prompt rendering (docs/structured-outputs.md):

    <the system message, if any>

    You can call these tools. To call one, answer with only
    <tool_call>{"name": "<tool name>", "arguments": {<arguments>}}</tool_call>
    Tools (each with the JSON Schema of its arguments):
    {"name": ..., "description": ..., "parameters": {...}}
    ...

An assistant turn that called tools is rendered as those `<tool_call>` blocks; a `tool` turn is
its content (the template's `tool` role).
"""

from __future__ import annotations

import json
from typing import Any

from runtime.models.tokenizer import Tokenizer
from runtime.server.openai.schemas import ChatMessage
from runtime.server.openai.tools.plan import ToolPlan

__all__ = ["render_chat_prompt", "tool_call_text"]

TOOL_PREAMBLE = (
    "You can call these tools. To call one, answer with only\n"
    '<tool_call>{"name": "<tool name>", "arguments": {<arguments>}}</tool_call>\n'
    "Tools (each with the JSON Schema of its arguments):\n"
)


def tool_call_text(name: str, arguments: str) -> str:
    try:
        args: Any = json.loads(arguments)
    except ValueError:
        args = arguments
    call = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    return "<tool_call>" + call + "</tool_call>"


def _message(m: ChatMessage) -> dict[str, Any]:
    out = m.turn  # text parts joined (runtime.server.openai.schemas.ContentParts)
    if m.tool_calls:
        calls = "".join(tool_call_text(c.function.name, c.function.arguments) for c in m.tool_calls)
        out["content"] += calls
        out["tool_calls"] = [c.model_dump() for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def render_chat_prompt(tokenizer: Tokenizer, messages: list[ChatMessage], plan: ToolPlan) -> str:
    rendered = [_message(m) for m in messages]
    if not plan.is_offered:
        return tokenizer.apply_chat_template(rendered)
    template = tokenizer.chat_template or ""
    if "tools" in template:  # the model's own tool format
        tools = [{"type": "function", "function": t} for t in plan.tools]
        return tokenizer.apply_chat_template(rendered, tools=tools)
    listing = TOOL_PREAMBLE + "\n".join(json.dumps(t) for t in plan.tools)
    if rendered[0]["role"] == "system":
        rendered[0] = {**rendered[0], "content": rendered[0]["content"] + "\n\n" + listing}
    else:
        rendered.insert(0, {"role": "system", "content": listing})
    return tokenizer.apply_chat_template(rendered)
