"""What crosses the engine boundary: a request in (`GenerationRequest`, checked into a
`ValidatedRequest`), a stream of token outputs back (`TokenOutput` in a `RequestHandle`: they live
in runtime.engine.handle and are re-exported here, where callers have always found them).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runtime.engine.handle import RequestHandle, TokenLogprob, TokenOutput
from runtime.engine.sampling import SamplingParams
from runtime.engine.stats import RequestStats
from runtime.errors import InvalidRequestError

if TYPE_CHECKING:
    from runtime.engine.constraints.spec import ConstraintSpec
    from runtime.engine.lora.registry import ResidentAdapter
    from runtime.models.tokenizer import Tokenizer

__all__ = [
    "GenerationRequest",
    "RequestHandle",
    "TokenLogprob",
    "TokenOutput",
    "ValidatedRequest",
    "context_room",
    "tokenize_prompt",
]


@dataclass
class GenerationRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    model: str = ""
    version: str = "stable"
    operation: str = "text_completion"  # text_completion | chat (gen_ai.operation.name)
    timeout_s: float | None = None  # None = the engine's request_timeout_s
    traceparent: str | None = None
    user: str | None = None
    constraint: ConstraintSpec | None = None  # structured output (runtime.engine.constraints)
    # prefix-cache namespace: only sequences with the same salt share cached pages (the server
    # sets it from the API key's tenant and the body's `cache_salt`; "" = the shared namespace)
    cache_salt: str = ""
    # who sent it (the API key's tenant, or the client's address without keys): its share of
    # the grammar compile workers (runtime.engine.constraints.pool); "": cache_salt stands in
    tenant: str = ""
    # the final output carries the request's timings (`TokenOutput.metrics`): the server's
    # enable_request_metrics; off, nothing is derived
    report_metrics: bool = False
    # scheduling priority, vLLM's: lower runs first (runtime.engine.priority); only read under
    # the priority scheduling policy
    priority: int = 0
    # the API request it belongs to (a batch's prompts share it; None: its own): its share of
    # the batch and its turn in the waiting queue (runtime.engine.fair_share)
    group: str | None = None
    # speculative decoding (when the server has it on): False opts this request out
    speculative: bool = True
    lora: str = ""  # a LoRA adapter registered on the engine, by name ("": the base model)


@dataclass
class ValidatedRequest:
    """A request that passed every check (Engine.validate); admitted as it is (Engine.admit)."""

    request: GenerationRequest
    prompt_ids: list[int]  # checked against the vocabulary, the context and the KV budget
    stats: RequestStats  # the request's record from here on (queued_ts = validation time)
    deadline: float  # time.monotonic() past which the request fails with RequestTimeout
    lora: ResidentAdapter | None = None  # the adapter's resident weights, when one was asked


def context_room(context: int, num_prompt_tokens: int) -> int:
    """Completion tokens the model's context leaves after the prompt: prompt + max_tokens must
    fit it (tokenize_prompt refuses what does not; the API's default max_tokens stays within)."""
    return context - num_prompt_tokens


def tokenize_prompt(
    tokenizer: Tokenizer,
    prompt: str | Seq[int],
    *,
    vocab_size: int,
    context: int,
    max_tokens: int = 1,
) -> list[int]:
    """Prompt ids, checked against the vocabulary and the model's context window."""
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    else:
        ids = list(prompt)
        if any(
            isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size for t in ids
        ):
            raise InvalidRequestError(
                f"prompt token ids must be in [0, {vocab_size})", param="prompt"
            )
    if not ids:
        raise InvalidRequestError("prompt is empty", param="prompt")
    room = context_room(context, len(ids))
    if room <= 0:
        raise InvalidRequestError(
            f"prompt is {len(ids)} tokens; this model's context is {context} tokens", param="prompt"
        )
    if max_tokens > room:
        raise InvalidRequestError(
            f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds this model's "
            f"context of {context} tokens",
            param="max_tokens",
        )
    return ids
