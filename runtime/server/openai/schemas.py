"""OpenAI-compatible request bodies (the subset this server speaks) and the error body; the
response bodies are in runtime.server.openai.replies.

Requests are strict (`"5"` is not an integer) and ignore unknown fields, as OpenAI-compatible
servers do, so clients that send extra parameters keep working; OpenAI's own fields that this
server does not implement (suffix, functions, ...) are refused unless sent with
their neutral value (runtime.server.openai.unsupported). These models are also what /openapi.json
documents, so schemathesis generates cases from exactly these rules. Chat content as a list of
text parts is runtime.server.openai.content_parts'.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from runtime.engine.sampling import MAX_CHOICES
from runtime.engine.sampling.checks import MAX_LOGIT_BIAS, MAX_LOGPROBS, PENALTY_BOUNDS
from runtime.server.openai.content_parts import ContentParts
from runtime.server.openai.features import (
    CHAT_LOGPROBS,
    COMPLETION_LOGPROBS,
    CONTROLS,
    STRUCTURED,
    TOOLS,
    Features,
)
from runtime.server.openai.structured import ChatToolFields, StructuredFields, ToolCall
from runtime.server.openai.unsupported import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    EMBEDDING_FIELDS,
    refuse_unsupported,
)

# Bounds a client may send; the engine and the model's context bound them further (as 400s).
MAX_STOP = 4
MAX_PROMPTS = 32  # prompts in one completions request (each runs as a request of its own)
MAX_STOP_TOKEN_IDS = 64
# seeds within the doubles' exact integers, so every JSON encoder round-trips them exactly
SEED_MIN, SEED_MAX = -(2**53 - 1), 2**53 - 1


def _integral(value: Any) -> Any:
    # JSON Schema counts 3.0 as an integer; strict pydantic would not. Strings stay refused.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# bounds sit inside the Annotated so /openapi.json shows them as minimum / maximum
PositiveInt = Annotated[int, Field(ge=1), BeforeValidator(_integral)]
Choices = Annotated[int, Field(ge=1, le=MAX_CHOICES), BeforeValidator(_integral)]
NonNegativeInt = Annotated[int, Field(ge=0), BeforeValidator(_integral)]
TopLogprobs = Annotated[int, Field(ge=0, le=MAX_LOGPROBS), BeforeValidator(_integral)]
Seed = Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX), BeforeValidator(_integral)]
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1), BeforeValidator(_integral)]
Priority = Annotated[int, Field(ge=-(2**31), le=2**31 - 1), BeforeValidator(_integral)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
# logit_bias: token ids as JSON object keys; the schema states that no other key is allowed
_TOKEN_KEY = r"^[0-9]{1,10}$"
LogitBias = Annotated[
    dict[
        Annotated[str, Field(pattern=_TOKEN_KEY)],
        Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)],
    ],
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"pattern": _TOKEN_KEY},
            "additionalProperties": {
                "type": "number",
                "minimum": -MAX_LOGIT_BIAS,
                "maximum": MAX_LOGIT_BIAS,
            },
        }
    ),
]


def _penalty(default: float, name: str, description: str | None = None) -> Any:
    low, high = PENALTY_BOUNDS[name]
    return Field(default, ge=low, le=high, description=description)


PRIORITY = (
    "extension (as vLLM): with scheduling_policy=priority, lower runs first (FIFO within a "
    "priority); default: the API key's (api_key_priorities), else 0"
)


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = Field(False, description="extension (as vLLM): usage per chunk")


class _Sampling(_Request, StructuredFields):
    model: str = Field(min_length=1, max_length=256)
    max_tokens: PositiveInt | None = Field(None, description="default 16 (completions), 256 (chat)")
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: Choices = Field(1, description=f"choices per prompt (at most {MAX_CHOICES})")
    stop: NonEmptyStr | Annotated[list[NonEmptyStr], Field(max_length=MAX_STOP)] | None = None
    seed: Seed | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)
    ignore_eos: bool = Field(False, description="extension (as vLLM): run to max_tokens")
    cache_salt: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="extension (as vLLM): only requests with the same salt share cached prefixes",
    )
    priority: Priority | None = Field(None, description=PRIORITY)
    speculative: bool = Field(
        True,
        description="extension: false opts this request out of speculative decoding "
        "(when the server runs it: speculative_method)",
    )
    # sampling controls (runtime.engine.logits; runtime.server.openai.controls maps them)
    # their bounds are the engine's (runtime.engine.sampling.checks.PENALTY_BOUNDS)
    presence_penalty: float = _penalty(0.0, "presence_penalty")
    frequency_penalty: float = _penalty(0.0, "frequency_penalty")
    repetition_penalty: float = _penalty(1.0, "repetition_penalty", "extension (as vLLM)")
    logit_bias: LogitBias | None = Field(
        None, description="token id (as a string) -> bias added to its logit"
    )
    min_tokens: NonNegativeInt = Field(0, description="extension (as vLLM): eos held off")
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    return_tokens_as_token_ids: bool = Field(False, description="extension (as vLLM)")

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats

    @functools.cached_property
    def features(self) -> Features:
        """What the body asks beyond a plain request (runtime.server.openai.features)."""
        sent = self.model_fields_set
        return Features(
            choices=self.n != 1 or self.continuous_usage or self._is_batch(),
            logprobs=not sent.isdisjoint(self._logprob_fields()),
            controls=not sent.isdisjoint(CONTROLS),
            structured=not sent.isdisjoint(STRUCTURED),
            tools=self._uses_tools(),
        )

    def _is_batch(self) -> bool:
        return False

    def _logprob_fields(self) -> frozenset[str]:
        return CHAT_LOGPROBS

    def _uses_tools(self) -> bool:
        return False


def _refused_if_named(data: Any, fields: dict[str, tuple[Any, ...]]) -> Any:
    """runtime.server.openai.unsupported's check, only for a body that names one of `fields`
    (one set operation decides: a body that names none never runs it)."""
    if isinstance(data, dict) and not fields.keys().isdisjoint(data):
        return refuse_unsupported(data, fields)
    return data


class CompletionRequest(_Sampling):
    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        return _refused_if_named(data, COMPLETION_FIELDS)

    max_tokens: NonNegativeInt | None = Field(
        None, description="default 16; 0 only with echo (score the prompt, generate nothing)"
    )
    logprobs: TopLogprobs | None = Field(None, description="alternatives per token (0-20)")
    echo: bool = Field(False, description="the prompt before the completion (and its logprobs)")

    # a string, token ids, or a batch of either (one request per prompt, answered together)
    prompt: (
        NonEmptyStr
        | TokenIds
        | Annotated[list[NonEmptyStr], Field(min_length=1, max_length=MAX_PROMPTS)]
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
    )
    best_of: Choices | None = Field(
        None, description="sequences per prompt (>= n); the n of highest cumulative logprob"
    )

    @property
    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            return list(p)  # type: ignore[arg-type]
        return [p]  # type: ignore[list-item]

    @property
    def single_prompt(self) -> str | list[int]:
        return self.prompts[0]

    def _is_batch(self) -> bool:
        return self.best_of not in (None, 1) or len(self.prompts) != 1

    def _logprob_fields(self) -> frozenset[str]:
        return COMPLETION_LOGPROBS


class ChatMessage(_Request):
    role: Literal["system", "user", "assistant", "tool"]
    # a list of text parts is joined (ContentParts, content_parts.py); None: an assistant turn that
    # only called tools
    content: str | ContentParts | None = None
    # an assistant turn's calls (runtime.server.openai.tools)
    tool_calls: list[ToolCall] | None = Field(None, max_length=16)
    tool_call_id: str | None = None  # a tool result: the call it answers
    name: str | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)

    @property
    def turn(self) -> dict[str, Any]:
        """The chat template's message of this turn, its tool calls aside (those are rendered by
        runtime.server.openai.tools)."""
        return {"role": self.role, "content": self.text}


class ChatCompletionRequest(_Sampling, ChatToolFields):
    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        return _refused_if_named(data, CHAT_FIELDS)

    messages: list[ChatMessage] = Field(min_length=1, max_length=1024)
    max_completion_tokens: PositiveInt | None = Field(None, description="alias of max_tokens")
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = Field(None, description="with logprobs: alternatives")

    def _uses_tools(self) -> bool:
        """Tools offered, or tool turns in the history (rendered by runtime.server.openai.tools)."""
        return not self.model_fields_set.isdisjoint(TOOLS) or any(
            m.tool_calls or m.tool_call_id is not None for m in self.messages
        )


class EmbeddingRequest(_Request):
    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        return _refused_if_named(data, EMBEDDING_FIELDS)

    model: str = Field(min_length=1, max_length=256)
    input: NonEmptyStr | Annotated[list[NonEmptyStr], Field(min_length=1, max_length=256)]
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = Field(None, max_length=256)


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
