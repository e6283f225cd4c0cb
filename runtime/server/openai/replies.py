"""OpenAI-compatible response bodies: what /openapi.json documents for each endpoint (the
handlers return plain dicts of these shapes; FastAPI checks them against these models).
The request bodies and the error body are in runtime.server.openai.schemas."""

from __future__ import annotations

import operator
from functools import partial
from typing import Any, Literal

from pydantic import BaseModel, Field

from runtime.server.openai.logprobs import ChatLogprobs, CompletionLogprobs
from runtime.server.openai.structured import ToolCall

__all__ = [
    "AssistantMessage",
    "ChatChoice",
    "ChatCompletionResponse",
    "CompletionChoice",
    "CompletionResponse",
    "Embedding",
    "EmbeddingResponse",
    "ModelCard",
    "ModelList",
    "PromptTokensDetails",
    "Usage",
]

# present only with enable_request_metrics (runtime.engine.timings.RequestMetrics: queue, prefill
# and decode seconds, TTFT, mean inter-token latency, tokens/s, cached prompt tokens)
_M = "extension (enable_request_metrics): this request's timings"
# `metrics` is left out of a reply without it; a C predicate, so a plain reply's serialisation
# runs no code of this module
_IS_NONE = partial(operator.is_, None)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None  # completions and chat


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: CompletionLogprobs | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    metrics: dict[str, Any] | None = Field(None, exclude_if=_IS_NONE, description=_M)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    metrics: dict[str, Any] | None = Field(None, exclude_if=_IS_NONE, description=_M)


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # str: base64 of little-endian float32


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "fastllm"
    parent: str | None = None  # a LoRA adapter: the model it runs on (None: a base model)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
