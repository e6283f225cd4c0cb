"""`tools` + `tool_choice` -> a ToolPlan: the mode, the checked tool definitions and, for
`required` and a named function, the constraint that makes the output a call.

- none: tools are not offered (not rendered) and nothing is constrained.
- auto (the default when tools are given): tools are rendered; the model may answer with text or
  with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (parse.py).
- required: the output is constrained to `{"name": <one of the tools>, "arguments": <its
  parameters schema>}` (one call).
- named (`{"type": "function", "function": {"name": ...}}`): the output is constrained to that
  function's parameters schema; the text is the call's `arguments`.

Each tool's `parameters` passes the constraint checks (runtime.engine.constraints.rules, with the
default bounds, then XGrammar's parse) whatever the mode: one answer for one schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from runtime.engine.constraints import ConstraintSpec
from runtime.errors import InvalidRequestError
from runtime.server.openai.structured import ChatToolFields, NamedToolChoice

__all__ = ["ToolPlan", "plan_tools"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolPlan:
    mode: str  # none | auto | required | named
    tools: tuple[dict[str, Any], ...]  # {"name", "description", "parameters"} per tool
    name: str | None = None  # the named function (mode "named")

    @property
    def is_offered(self) -> bool:
        return self.mode != "none" and bool(self.tools)

    def constraint(self) -> ConstraintSpec | None:
        if self.mode == "named":
            tool = next(t for t in self.tools if t["name"] == self.name)
            return ConstraintSpec.json_schema(tool["parameters"], "tools", label="tools")
        if self.mode == "required":
            variants = [
                {
                    "type": "object",
                    "properties": {"name": {"const": t["name"]}, "arguments": t["parameters"]},
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
                for t in self.tools
            ]
            schema = variants[0] if len(variants) == 1 else {"anyOf": variants}
            return ConstraintSpec.json_schema(schema, "tools", label="tools")
        return None


def plan_tools(body: ChatToolFields) -> ToolPlan:
    tools = tuple(_checked(i, tool.function) for i, tool in enumerate(body.tools or ()))
    choice = body.tool_choice
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in {t["name"] for t in tools}:
            raise InvalidRequestError(
                f"tool_choice names {choice.function.name!r}, which is not among the tools",
                param="tool_choice",
            )
        return ToolPlan("named", tools, choice.function.name)
    mode = choice or ("auto" if tools else "none")
    if mode == "required" and not tools:
        raise InvalidRequestError("tool_choice 'required' needs tools", param="tool_choice")
    if len({t["name"] for t in tools}) != len(tools):
        raise InvalidRequestError("tools: two tools have the same name", param="tools")
    return ToolPlan(mode, tools)


def _checked(index: int, function: Any) -> dict[str, Any]:
    name = function.name
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidRequestError(
            f"tools[{index}].function.name is required: 1-64 letters, digits, _ or -",
            param="tools",
        )
    parameters = function.parameters if function.parameters is not None else _EMPTY_PARAMETERS
    try:  # under every tool_choice: a schema `required` would refuse is refused under `auto` too
        ConstraintSpec.json_schema(parameters, "tools", label="tools").check()
    except InvalidRequestError as exc:
        why = str(exc).removeprefix("tools: ")
        raise InvalidRequestError(
            f"tools[{index}].function.parameters: {why}", param="tools"
        ) from None
    return {"name": name, "description": function.description or "", "parameters": parameters}
