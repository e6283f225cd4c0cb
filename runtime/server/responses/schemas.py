"""The request body of POST /v1/responses (the subset this server speaks; docs/openai-api.md).

Like the other OpenAI bodies it is strict about types (`"5"` is not an integer) and ignores
fields it does not know, so a client's newer parameters do not break it. Input items and tools are
checked item by item in inputs.py and tools.py, where an unknown item type can be named in the
400 and an unknown tool type can be skipped with a warning instead.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime.server.openai.schemas import PRIORITY, PositiveInt, Priority, TopLogprobs

MAX_ITEMS = 4096  # input items of one request (a long agent session is mostly tool calls)
MAX_TOOLS = 128  # as chat's `tools`, after namespaces are flattened
INCLUDE_LOGPROBS = "message.output_text.logprobs"


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = Field(None, max_length=256)  # json_schema only
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    def echo(self) -> dict[str, Any]:
        if self.type != "json_schema":
            return {"type": self.type}
        return {
            "type": "json_schema",
            "name": self.name or "response",
            "description": self.description,
            "schema": self.schema_,
            "strict": self.strict,
        }


class TextConfig(_Strict):
    format: TextFormat = Field(default_factory=lambda: TextFormat.model_validate({}))
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted, not acted on


class ResponsesRequest(_Strict):
    model: str = Field(min_length=1, max_length=256)
    input: str | Annotated[list[dict[str, Any]], Field(max_length=MAX_ITEMS)] = Field(
        description="a user message, or items: message, function_call, function_call_output, "
        "reasoning (skipped)"
    )
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = Field(
        None, description="default: what the model's context leaves after the prompt"
    )
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_logprobs: TopLogprobs | None = None
    tools: Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)] | None = Field(
        None, description="function tools (and namespaces of them); other types are ignored"
    )
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    store: bool | None = Field(None, description="only false: responses are not kept")
    previous_response_id: str | None = Field(None, description="refused: responses are not kept")
    conversation: str | dict[str, Any] | None = Field(None, description="refused (not kept)")
    background: bool | None = Field(None, description="only false")
    include: Annotated[list[str], Field(max_length=32)] | None = None
    metadata: Annotated[dict[str, str], Field(max_length=16)] | None = None
    # accepted and echoed, with no effect on this server
    reasoning: dict[str, Any] | None = None
    prompt_cache_key: str | None = Field(None, max_length=1024)
    prompt_cache_retention: str | None = None
    client_metadata: dict[str, Any] | None = None
    service_tier: str | None = Field(None, max_length=64)
    safety_identifier: str | None = Field(None, max_length=256)
    truncation: Literal["auto", "disabled"] | None = None
    max_tool_calls: PositiveInt | None = None
    user: str | None = Field(None, max_length=256)
    priority: Priority | None = Field(None, description=PRIORITY)

    @property
    def wants_logprobs(self) -> bool:
        return self.top_logprobs is not None or INCLUDE_LOGPROBS in (self.include or ())
