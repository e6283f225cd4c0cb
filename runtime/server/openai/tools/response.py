"""The two decisions a chat route makes with a ToolPlan: the request's one constraint, and the
assistant message of a finished (non-streamed) output."""

from __future__ import annotations

from typing import Any

from runtime.engine.constraints import ConstraintSpec
from runtime.errors import InvalidRequestError
from runtime.server.openai.structured import StructuredFields, constraint_of
from runtime.server.openai.tools.parse import parse_tool_calls
from runtime.server.openai.tools.plan import ToolPlan

__all__ = ["assistant_message", "chat_constraint"]


def chat_constraint(body: StructuredFields, plan: ToolPlan) -> ConstraintSpec | None:
    """A forced tool call (required / named) or the body's structured output, never both."""
    structured, forced = constraint_of(body), plan.constraint()
    if forced is not None and structured is not None:
        raise InvalidRequestError(
            f"{structured.param} cannot be combined with tool_choice {plan.mode}",
            param=structured.param,
        )
    return forced or structured


def assistant_message(
    plan: ToolPlan, text: str, finished_reason: str | None
) -> tuple[dict[str, Any], str | None]:
    """(message, finish_reason): calls when tools were offered and the output parses into one."""
    if plan.is_offered and finished_reason == "stop":
        parsed = parse_tool_calls(plan, text)
        if parsed.tool_calls:
            message = {"role": "assistant", "content": parsed.content}
            return {**message, "tool_calls": parsed.tool_calls}, "tool_calls"
    return {"role": "assistant", "content": text}, finished_reason
