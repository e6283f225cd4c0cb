"""Request fields of structured output and tool calling (OpenAI's and vLLM's spellings).

`StructuredFields` is mixed into both completions and chat bodies; `ChatToolFields` into chat.
What they mean for the engine is decided below (`constraint_of`) and in
runtime.server.openai.tools.

`constraint_of`: from a request body's structured-output fields to the engine's `ConstraintSpec`.

OpenAI's `response_format` (`json_object`, `json_schema`), vLLM's `structured_outputs` (one of
json / regex / choice / grammar) and vLLM's older `guided_json` / `guided_regex` /
`guided_choice` / `guided_grammar`. At most one constraint per request: two are a 400 naming the
second. Whether the engine can take it (a schema feature, a regex, a grammar) is decided by the
engine's parse (runtime.engine.constraints.spec), which names the field too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime.engine.constraints import ConstraintSpec
from runtime.errors import InvalidRequestError

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
    name: str | None = None  # required; checked by runtime.server.openai.tools (a 400: `tools`)
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


def constraint_of(body: StructuredFields) -> ConstraintSpec | None:
    found: list[ConstraintSpec] = []
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        found.append(ConstraintSpec("json_object", "", "response_format"))
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise InvalidRequestError(
                "response_format.json_schema.schema is required for type json_schema",
                param="response_format",
            )
        found.append(ConstraintSpec.json_schema(fmt.json_schema.schema_, "response_format"))
    so = body.structured_outputs
    if so is not None:
        given = [k for k in ("json_", "regex", "choice", "grammar") if getattr(so, k) is not None]
        if len(given) != 1:
            raise InvalidRequestError(
                "structured_outputs takes exactly one of json, regex, choice, grammar",
                param="structured_outputs",
            )
        found.append(_spec(given[0].rstrip("_"), getattr(so, given[0]), "structured_outputs"))
    for kind in ("json", "regex", "choice", "grammar"):
        value = getattr(body, f"guided_{kind}")
        if value is not None:
            found.append(_spec(kind, value, f"guided_{kind}"))
    if len(found) > 1:
        raise InvalidRequestError(
            f"{found[1].param}: only one structured-output constraint per request "
            f"({found[0].param} is already one)",
            param=found[1].param,
        )
    return found[0] if found else None


def _spec(kind: str, value: object, param: str) -> ConstraintSpec:
    if kind == "json":
        return ConstraintSpec.json_schema(value, param)
    if kind == "choice":
        return ConstraintSpec.choice(value, param)
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{param}: must be a non-empty string", param=param)
    return ConstraintSpec(kind, value, param)
