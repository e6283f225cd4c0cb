"""`tools`, `tool_choice` and `text.format` -> the chat path's ToolPlan and one constraint.

Responses tools are flat (`{"type": "function", "name", "description", "parameters", "strict"}`);
a `namespace` tool is a group of them, flattened here (each call then names its namespace). Tools
of any other type (web_search, file_search, mcp, custom, ...) are hosted tools this server does
not run: they are left out, and the response says so in `warnings` (an agent that sends its whole
tool belt still gets an answer). `tool_choice` is `auto` / `required` / `none` or
`{"type": "function", "name": ...}`; the forced forms constrain the output as chat's do
(runtime.server.openai.tools.plan).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from runtime.engine.constraints import ConstraintSpec
from runtime.errors import InvalidRequestError
from runtime.server.openai.structured import ChatToolFields
from runtime.server.openai.tools import ToolPlan, plan_tools
from runtime.server.responses.schemas import MAX_TOOLS, ResponsesRequest

__all__ = ["ResponseTools", "response_constraint", "response_tools"]


@dataclass
class ResponseTools:
    plan: ToolPlan
    echoed: list[dict[str, Any]]  # the accepted tools, as the response repeats them
    namespaces: dict[str, str] = field(default_factory=dict)  # function name -> its namespace
    warnings: list[str] = field(default_factory=list)  # tools left out, and why


def _function(raw: dict[str, Any], where: str) -> dict[str, Any]:
    name, parameters = raw.get("name"), raw.get("parameters")
    description, strict = raw.get("description"), raw.get("strict")
    if not isinstance(name, str):
        raise InvalidRequestError(f"{where}.name is required (a string)", param="tools")
    if parameters is not None and not isinstance(parameters, dict):
        raise InvalidRequestError(f"{where}.parameters must be a JSON Schema object", param="tools")
    if description is not None and not isinstance(description, str):
        raise InvalidRequestError(f"{where}.description must be a string", param="tools")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequestError(f"{where}.strict must be a boolean", param="tools")
    return {
        "type": "function",
        "name": name,
        "description": description,
        "parameters": parameters,
        "strict": strict,
    }


def _choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """Responses' tool_choice in chat's spelling."""
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise InvalidRequestError(
        'tool_choice must be "auto", "required", "none" or {"type": "function", "name": ...}',
        param="tool_choice",
    )


def response_tools(body: ResponsesRequest) -> ResponseTools:
    functions: list[dict[str, Any]] = []
    echoed: list[dict[str, Any]] = []
    namespaces: dict[str, str] = {}
    warnings: list[str] = []
    for i, raw in enumerate(body.tools or ()):
        kind = raw.get("type")
        if kind == "function":
            functions.append(_function(raw, f"tools[{i}]"))
            echoed.append(functions[-1])
        elif kind == "namespace" and isinstance(raw.get("tools"), list):
            inner = [t for t in raw["tools"] if isinstance(t, dict) and t.get("type") == "function"]
            group = [_function(t, f"tools[{i}].tools[{j}]") for j, t in enumerate(inner)]
            functions.extend(group)
            namespaces.update({t["name"]: str(raw.get("name", "")) for t in group})
            echoed.append({**raw, "tools": group})
        else:
            shown = kind[:64] if isinstance(kind, str) else type(kind).__name__
            warnings.append(f"tools[{i}]: type {shown!r} is not supported by this server; ignored")
    if len(functions) > MAX_TOOLS:
        raise InvalidRequestError(f"at most {MAX_TOOLS} function tools", param="tools")
    chat_tools = [
        {"type": "function", "function": {k: v for k, v in f.items() if k != "type"}}
        for f in functions
    ]
    try:
        fields = ChatToolFields.model_validate(
            {"tools": chat_tools or None, "tool_choice": _choice(body.tool_choice)}
        )
    except ValidationError as exc:
        message = exc.errors()[0].get("msg", "invalid value")
        raise InvalidRequestError(f"tools / tool_choice: {message}", param="tools") from None
    return ResponseTools(plan_tools(fields), echoed, namespaces, warnings)


def response_constraint(body: ResponsesRequest, plan: ToolPlan) -> ConstraintSpec | None:
    """A forced call (tool_choice required / named), else `text.format`'s JSON. With both, the
    call wins: its output is a call, never a message, so the format has nothing to shape (an
    Agents SDK agent with an output type and a forced first tool sends both)."""
    forced = plan.constraint()
    if forced is not None:
        return forced
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type == "json_object":
        return ConstraintSpec("json_object", "", "text")
    if fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise InvalidRequestError(
                "text.format.schema is required for json_schema", param="text"
            )
        return ConstraintSpec.json_schema(fmt.schema_, "text")
    return None
