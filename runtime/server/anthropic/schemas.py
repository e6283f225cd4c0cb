"""The Messages API request bodies (the subset this server speaks).

Accepted and used: `model`, `max_tokens` (clamped to the context's room), `messages` (string or
block content: `text`, `tool_use`, `tool_result`; `thinking` / `redacted_thinking` blocks of
earlier turns are dropped), `system` (a string or text blocks), a `system`-role message,
`tools` (client tools: name, description, input_schema), `tool_choice`, `stop_sequences`,
`temperature`, `top_p`, `top_k`, `stream`, `metadata.user_id` (the user a canary split keys on),
`output_config.format` (a JSON Schema the text follows).
Accepted and ignored: `cache_control` anywhere (the prefix cache is automatic), `thinking`,
`context_management`, `output_config.effort`, `service_tier`, `container`, `mcp_servers`,
citations, server tools (a tool with a `type` other than `custom`) and any unknown field.
Refused (400): image, document and other non-text blocks (this server runs text models only).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from runtime.server.openai.schemas import PRIORITY, NonNegativeInt, PositiveInt, Priority
from runtime.server.openai.unsupported import UNSUPPORTED

MAX_MESSAGES = 100_000  # Anthropic's own bound
MAX_BLOCKS = 1024  # content blocks of one message
MAX_TOOLS = 1024
MAX_STOP_SEQUENCES = 16  # the engine's bound on stop strings
TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"
BLOCK_TYPES = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextBlock(_Body):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Body):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    input: dict[str, Any]


def _only_text(value: Any) -> Any:
    return _refuse_blocks(value, ("text",), "tool_result content")


class ToolResultBlock(_Body):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: (
        str
        | Annotated[list[TextBlock], Field(max_length=MAX_BLOCKS), BeforeValidator(_only_text)]
        | None
    ) = None
    is_error: bool = False

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(block.text for block in self.content)


class ThinkingBlock(_Body):
    """An earlier turn's reasoning, sent back by clients that got one: dropped from the prompt."""

    type: Literal["thinking", "redacted_thinking"]


def _refuse_blocks(value: Any, allowed: tuple[str, ...], where: str) -> Any:
    if isinstance(value, list):
        for block in value:
            kind = block.get("type") if isinstance(block, dict) else None
            if isinstance(kind, str) and kind not in allowed:
                raise PydanticCustomError(
                    UNSUPPORTED,
                    "{where}: content block type '{block_type}' is not supported by this server "
                    "(it takes {allowed})",
                    {
                        "field": "messages",
                        "where": where,
                        "block_type": kind[:64],
                        "allowed": ", ".join(allowed),
                    },
                )
    return value


def _known_blocks(value: Any) -> Any:
    return _refuse_blocks(value, BLOCK_TYPES, "messages")


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock, Field(discriminator="type")
]
Blocks = Annotated[list[Block], Field(max_length=MAX_BLOCKS), BeforeValidator(_known_blocks)]


class Message(_Body):
    role: Literal["user", "assistant", "system"]
    content: str | Blocks


class Tool(_Body):
    type: str | None = Field(None, description="`custom` (or absent); server tools are ignored")
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    input_schema: dict[str, Any] | None = Field(None, description="JSON Schema of the input")

    @property
    def is_client_tool(self) -> bool:
        return self.type in (None, "custom")


class ToolChoice(_Body):
    type: Literal["auto", "any", "none", "tool"]
    name: str | None = Field(None, description="the tool (type `tool`)")
    disable_parallel_tool_use: bool | None = Field(None, description="accepted (one call)")


class Metadata(_Body):
    model_config = ConfigDict(strict=True, extra="ignore")
    user_id: str | None = Field(None, max_length=512)


class OutputFormat(_Body):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Body):
    format: OutputFormat | None = None
    effort: str | None = Field(None, description="accepted, ignored")


class CountTokensRequest(_Body):
    model: str = Field(min_length=1, max_length=256)
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: str | Annotated[list[TextBlock], Field(max_length=MAX_BLOCKS)] | None = None
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = Field(None, description="accepted, ignored")
    context_management: dict[str, Any] | None = Field(None, description="accepted, ignored")
    output_config: OutputConfig | None = None

    @property
    def system_text(self) -> str | None:
        if self.system is None or isinstance(self.system, str):
            return self.system
        return "\n".join(block.text for block in self.system)


class MessagesRequest(CountTokensRequest):
    max_tokens: PositiveInt = Field(description="clamped to what the context leaves")
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, max_length=MAX_STOP_SEQUENCES
    )
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: NonNegativeInt | None = None
    stream: bool = False
    metadata: Metadata | None = None
    priority: Priority | None = Field(None, description=PRIORITY)

    @property
    def user(self) -> str | None:
        return self.metadata.user_id if self.metadata is not None else None
