"""The model's output -> OpenAI tool calls, per ToolPlan mode (plan.py says what each produces).
Output that does not parse into a call stays text (finish_reason is then not "tool_calls")."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from runtime.server.openai.tools.plan import ToolPlan

__all__ = ["ParsedOutput", "new_call_id", "parse_tool_calls"]

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
OPEN_TAG = "<tool_call>"


@dataclass(frozen=True)
class ParsedOutput:
    content: str | None  # text besides the calls (None when there is none)
    tool_calls: list[dict[str, Any]]  # OpenAI's {"id", "type", "function": {name, arguments}}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _call(name: str, arguments: Any) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": text}}


def parse_tool_calls(plan: ToolPlan, text: str) -> ParsedOutput:
    names = {t["name"] for t in plan.tools}
    if plan.mode == "named" and plan.name is not None:
        try:
            json.loads(text)
        except ValueError:
            return ParsedOutput(text, [])
        return ParsedOutput(None, [_call(plan.name, text)])
    if plan.mode == "required":
        call = _as_call(text, names)
        return ParsedOutput(None, [call]) if call else ParsedOutput(text, [])
    if plan.mode != "auto" or OPEN_TAG not in text:
        return ParsedOutput(text, [])
    calls = [c for c in (_as_call(m.group(1), names) for m in _BLOCK.finditer(text)) if c]
    if not calls:
        return ParsedOutput(text, [])
    content = text[: text.index(OPEN_TAG)].strip()
    return ParsedOutput(content or None, calls)


def _as_call(text: str, names: set[str]) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("name") not in names:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    return _call(data["name"], arguments)
