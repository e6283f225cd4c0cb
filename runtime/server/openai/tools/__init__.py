"""Tool calling: which tools a chat request offers, how they reach the prompt, how the output
becomes `message.tool_calls` (plan.py, render.py, parse.py) and its streamed form (stream.py)."""

from runtime.server.openai.tools.parse import parse_tool_calls
from runtime.server.openai.tools.plan import ToolPlan, plan_tools
from runtime.server.openai.tools.render import render_chat_prompt

__all__ = ["ToolPlan", "parse_tool_calls", "plan_tools", "render_chat_prompt"]
