"""Request fields of the sampling controls and logprobs -> SamplingParams fields.

Kept apart from the routes so each route asks for its own logprobs shape in one line:
completions' `logprobs: k` (and with `echo`, the prompt's too), chat's `logprobs` + `top_logprobs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runtime.errors import InvalidRequestError

if TYPE_CHECKING:
    from runtime.server.openai.schemas import ChatCompletionRequest, CompletionRequest, _Sampling

__all__ = [
    "chat_logprob_fields",
    "completion_logprob_fields",
    "control_fields",
    "scored_max_tokens",
]


def control_fields(body: _Sampling) -> dict[str, Any]:
    return {
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "repetition_penalty": body.repetition_penalty,
        # OpenAI sends token ids as JSON object keys: digits only (the schema's LogitBias)
        "logit_bias": tuple((int(k), float(v)) for k, v in (body.logit_bias or {}).items()),
        "min_tokens": body.min_tokens,
        "stop_token_ids": tuple(body.stop_token_ids or ()),
    }


def completion_logprob_fields(body: CompletionRequest) -> dict[str, Any]:
    """`logprobs: k`: k alternatives per sampled token; with `echo`, per prompt token too."""
    return {
        "logprobs": body.logprobs,
        "prompt_logprobs": body.logprobs if body.echo else None,
    }


def chat_logprob_fields(body: ChatCompletionRequest) -> dict[str, Any]:
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequestError("top_logprobs needs logprobs: true", param="top_logprobs")
    return {"logprobs": (body.top_logprobs or 0) if body.logprobs else None}


def scored_max_tokens(body: CompletionRequest) -> int | None:
    """The engine's max_tokens for a completion (None: the route's default). `max_tokens: 0`
    with `echo` scores the prompt: the engine samples one token (the prompt's logprobs come with
    it) and the response leaves it out
    (runtime.server.openai.logprobs.CompletionShaper.drop_sampled), as vLLM does."""
    if body.max_tokens != 0:
        return body.max_tokens
    if not body.echo:
        raise InvalidRequestError(
            "max_tokens must be at least 1 (0 only with echo: the prompt scored)",
            param="max_tokens",
        )
    return 1
