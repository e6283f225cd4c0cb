"""Anthropic `tools` + `tool_choice` -> the chat path's ToolPlan (runtime.server.openai.tools).

`tool_choice` maps onto the chat modes: `auto` -> auto, `any` -> required (one call to some
tool), `{"type": "tool", "name"}` -> named, `none` -> none. A forced call (any / tool) is
constrained by the tools' input schemas, fitted to the grammar engine first (fit_schema.py).
`output_config.format` constrains a text answer instead, never together with a forced call.
"""

from __future__ import annotations

from runtime.engine.constraints import ConstraintSpec
from runtime.errors import InvalidRequestError
from runtime.server.anthropic.fit_schema import fit_schema
from runtime.server.anthropic.schemas import CountTokensRequest, Tool
from runtime.server.openai.structured import (
    ChatToolFields,
    FunctionDef,
    NamedFunction,
    NamedToolChoice,
    ToolDef,
)
from runtime.server.openai.tools import ToolPlan, plan_tools

__all__ = ["constraint_of", "tool_plan"]

_MODES = {"auto": "auto", "any": "required", "none": "none"}


def tool_plan(body: CountTokensRequest) -> ToolPlan:
    """The plan; tools are checked (names, duplicates) as the chat path checks them."""
    tools = [t for t in body.tools or () if t.is_client_tool]  # server tools: ignored
    kind = body.tool_choice.type if body.tool_choice is not None else None
    name = body.tool_choice.name if body.tool_choice is not None else None
    if kind in ("any", "tool") and not tools:
        raise InvalidRequestError(
            f"tool_choice {kind!r} needs at least one tool", param="tool_choice"
        )
    choice: str | NamedToolChoice | None = None
    if kind == "tool":
        if not name:
            raise InvalidRequestError(
                "tool_choice of type 'tool' needs a name", param="tool_choice"
            )
        choice = NamedToolChoice(function=NamedFunction(name=name))
    elif kind is not None:
        choice = _MODES[kind]

    def is_forced(tool: Tool) -> bool:  # its schema becomes a grammar
        return kind == "any" or (kind == "tool" and tool.name == name)

    defs = [_tool_def(t, fit=is_forced(t)) for t in tools]
    # model_construct: the chat body's own bound on the number of tools (128) is not Anthropic's
    return plan_tools(ChatToolFields.model_construct(tools=defs, tool_choice=choice))


def constraint_of(body: CountTokensRequest, plan: ToolPlan) -> ConstraintSpec | None:
    """A forced tool call's constraint, or the output format's; never both."""
    forced = plan.constraint()
    fmt = body.output_config.format if body.output_config is not None else None
    if fmt is None:
        return forced
    if forced is not None:
        raise InvalidRequestError(
            f"output_config.format cannot be combined with tool_choice {plan.mode}",
            param="output_config",
        )
    return ConstraintSpec.json_schema(fit_schema(fmt.schema_), "output_config")


def _tool_def(tool: Tool, *, fit: bool) -> ToolDef:
    schema = fit_schema(tool.input_schema) if fit else tool.input_schema
    function = FunctionDef.model_construct(
        name=tool.name, description=tool.description, parameters=schema, strict=None
    )
    return ToolDef.model_construct(type="function", function=function)
