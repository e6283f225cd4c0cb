"""A request on its way in: every check it must pass, once (`validate_request`), and the sequence
(with its choices, n > 1) it becomes once admitted (`new_sequence`). A plain request builds no
feature state: a constraint's hooks run only for a request with a constraint, choices only for
n / best_of > 1, the verifier's state only for a request it sampled; `close_features` closes only
the features a sequence has."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from runtime.engine.choices import make_choices
from runtime.engine.config import EngineConfig
from runtime.engine.constraints import hooks as constraint_hooks
from runtime.engine.features import features_for
from runtime.engine.lora.wiring import lora_registry, lora_salt
from runtime.engine.request import (
    GenerationRequest,
    RequestHandle,
    ValidatedRequest,
    tokenize_prompt,
)
from runtime.engine.sampling.checks import check_token_ids
from runtime.engine.sequence import Sequence
from runtime.engine.stats import RequestStats
from runtime.engine.stopping import StopChecker
from runtime.errors import InvalidRequestError

if TYPE_CHECKING:
    from collections.abc import Callable

    from runtime.engine.build import EngineParts
    from runtime.engine.client import SequenceVerifier
    from runtime.engine.features import SeqFeatures
    from runtime.models.loader import LoadedModel

__all__ = ["close_features", "new_sequence", "validate_request"]


def validate_request(
    config: EngineConfig, parts: EngineParts, request: GenerationRequest
) -> ValidatedRequest:
    """Raise InvalidRequestError naming the parameter; the result can be admitted here or, by
    serving.ReplicaSet, on any replica."""
    loaded = parts.loaded
    if not parts.is_causal_lm:
        raise InvalidRequestError(
            f"{config.model_name or loaded.path} is an embedding model; it cannot generate text",
            param="model",
        )
    params = request.sampling
    ids = tokenize_prompt(
        parts.tokenizer,
        request.prompt_token_ids,
        vocab_size=loaded.args.vocab_size,
        context=loaded.args.max_position_embeddings,
        max_tokens=params.max_tokens,
    )
    check_token_ids(params, loaded.args.vocab_size)
    capacity = len(ids) + params.max_tokens
    kv_tokens = parts.kv_cache.max_tokens
    if not parts.kv_cache.can_fit(len(ids)):  # it could never be scheduled: refuse, not queue
        raise InvalidRequestError(
            f"prompt ({len(ids)} tokens) is longer than this server's KV cache holds "
            f"({kv_tokens} tokens)",
            param="prompt",
        )
    if not parts.kv_cache.can_fit(capacity):  # alone, it could run out of pages before the end
        raise InvalidRequestError(
            f"prompt + max_tokens ({capacity} tokens) does not fit in this server's KV cache "
            f"({kv_tokens} tokens)",
            param="max_tokens",
        )
    if len(ids) > config.max_queued_tokens:
        raise InvalidRequestError(
            f"prompt is longer than the queue bound ({config.max_queued_tokens} tokens)",
            param="prompt",
        )
    if request.timeout_s is not None and not request.timeout_s > 0:
        raise InvalidRequestError("timeout must be positive", param="timeout")
    timeout_s = request.timeout_s or config.request_timeout_s
    if request.constraint is not None:
        constraint_hooks.validate(parts.grammars, request)
    adapter = None
    if request.lora:  # resident (loaded again if evicted) before the request is queued
        adapter = lora_registry(parts, config).acquire(request.lora)
        # its pages are keyed by the adapter: never shared with the base or another adapter
        request = replace(request, cache_salt=lora_salt(adapter.key, request.cache_salt))
    stats = RequestStats(
        request_id=request.request_id,
        model=request.model or config.model_name,
        version=request.version,
        queued_ts=time.time(),
        prompt_tokens=len(ids),
        max_tokens=params.max_tokens,
        n=params.n,
        operation=request.operation,
        traceparent=request.traceparent,
        constraint="none" if request.constraint is None else constraint_hooks.label(request),
        logprobs=params.logprobs is not None or params.prompt_logprobs is not None,
        priority=request.priority,
        adapter=request.lora or None,
    )
    return ValidatedRequest(
        request, ids, stats, deadline=time.monotonic() + timeout_s, lora=adapter
    )


def new_sequence(
    parts: EngineParts,
    validated: ValidatedRequest,
    verifier: SequenceVerifier | None,
    cancel: Callable[[str], bool],
) -> Sequence:
    """Choice 0 of the request (the others hang on it until its prefill ends)."""
    request, params = validated.request, validated.request.sampling
    handle = RequestHandle(request.request_id, cancel, num_choices=params.num_seqs)

    def choice(index: int, stats: RequestStats) -> Sequence:
        verified = (
            index == 0 and verifier is not None and verifier.should_verify(request.request_id)
        )
        constraint = None
        if request.constraint is not None:  # each choice its own matcher
            constraint = constraint_hooks.new_state(parts.grammars, request)
        features = None  # decided here, once: a plain choice never enters features.py
        if not params.is_plain or constraint is not None or verified or validated.lora:
            features = features_for(
                params,
                index,
                parts.loaded.device,
                constraint=constraint,
                verified=verified,
                lora=validated.lora,
            )
        return Sequence(
            request=request,
            handle=handle,
            stats=stats,
            deadline=validated.deadline,
            stop_checker=StopChecker(parts.tokenizer, params, validated.prompt_ids),
            features=features,
        )

    first = choice(0, validated.stats)
    if params.num_seqs > 1:
        make_choices(first, choice)
    return first


def close_features(
    seq: Sequence,
    features: SeqFeatures,
    verifier: SequenceVerifier | None,
    loaded: LoadedModel,
) -> None:
    """A sequence with features closed (under the core lock): each feature's outcome, only for
    the features it has."""
    if features.constraint is not None:
        constraint_hooks.record_outcome(features.constraint, seq.stats)
    if verifier is not None and features.verify is not None:
        verifier.submit_sequence(seq, loaded.model, loaded.dtype)  # only queues a job
    # the adapter's block is released on unload only once nothing refers to it; a closed
    # sequence may live on a while (a handle, a GC cycle), so it lets go of the weights here
    features.lora = None
