"""Request fields of structured output and tool calling (OpenAI's and vLLM's spellings).

`StructuredFields` is mixed into both completions and chat bodies; `ChatToolFields` into chat.
What they mean for the engine is decided in runtime.server.structured and runtime.server.tools.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Choices = Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=256)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)


class JsonSchemaFormat(_Strict):
    name: str = Field("response", max_length=256)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Strict):
    """vLLM's `structured_outputs`: exactly one of these."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: Choices | None = None
    grammar: str | None = None


class StructuredFields(_Strict):
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = Field(
        None, description="extension (as vLLM): one of json, regex, choice, grammar"
    )
    guided_json: dict[str, Any] | str | None = Field(None, description="extension (as vLLM)")
    guided_regex: str | None = Field(None, description="extension (as vLLM)")
    guided_choice: Choices | None = Field(None, description="extension (as vLLM)")
    guided_grammar: str | None = Field(None, description="extension (as vLLM): EBNF")


class FunctionDef(_Strict):
    name: str | None = None  # required; checked by runtime.server.tools (a 400 naming `tools`)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: NamedFunction


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatToolFields(_Strict):
    tools: list[ToolDef] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
