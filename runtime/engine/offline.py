"""Offline generation: a list of prompts in, their completions out, through the same `Engine`
the server runs (as nano-vllm's `LLM.generate` does), with no sink. The CLI's `generate`, the
doctor, the parity tests and `bench.generate` use it, so there is one decode loop in the project.

    results = generate(load_model(path), ["Once", "The cache"], SamplingParams(max_tokens=16))

All prompts are admitted at once and the batch limit is pinned to their number, so they run as
one continuous batch (prefill chunked by the token budget, then decode together).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace

from runtime.engine.config import EngineConfig
from runtime.engine.engine import Engine
from runtime.engine.request import GenerationRequest, tokenize_prompt
from runtime.engine.sampling import SamplingParams
from runtime.engine.stats import FinishReason
from runtime.errors import InvalidRequestError
from runtime.models.loader import LoadedModel

__all__ = ["GenerationResult", "generate"]


@dataclass
class GenerationResult:
    token_ids: list[int]  # completion ids, incl. the eos / stop token that ended it
    text: str  # completion text; a matched stop string and what follows it are cut
    finished_reason: FinishReason  # STOP | LENGTH
    prompt_tokens: int
    completion_tokens: int


def generate(
    loaded: LoadedModel,
    prompts: Sequence[str | Sequence[int]],
    params: SamplingParams,
    *,
    compile: str = "auto",
    num_threads: int | None = None,
) -> list[GenerationResult]:
    """`compile`: the engine's setting (auto | on | off); off decodes on the eager forward.
    `num_threads`: intra-op threads set inside the engine's loop thread (None: it inherits the
    caller's count when it starts; 0: the physical cores)."""
    if not loaded.is_causal_lm:
        raise InvalidRequestError(f"{loaded.path} is an encoder model; it cannot generate text")
    tokenizer = loaded.tokenizer
    if tokenizer is None:
        raise InvalidRequestError(f"{loaded.path} was loaded without its tokenizer")
    args = loaded.args
    prompt_ids = [
        tokenize_prompt(
            tokenizer,
            p,
            vocab_size=args.vocab_size,
            context=args.max_position_embeddings,
            max_tokens=params.max_tokens,
        )
        for p in prompts
    ]
    if not prompt_ids:
        return []
    config = replace(
        _offline_config(loaded, prompt_ids, params), compile=compile, num_threads=num_threads
    )
    engine = Engine(config, loader=lambda: loaded)
    try:
        handles = [
            engine.submit(GenerationRequest(f"offline-{uuid.uuid4().hex}", ids, params))
            for ids in prompt_ids
        ]
        outputs = [handle.result() for handle in handles]
    finally:
        engine.shutdown()
    return [
        GenerationResult(
            token_ids=out.token_ids,
            text=out.text,
            finished_reason=out.finished_reason or FinishReason.LENGTH,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
        )
        for out in outputs
    ]


def _offline_config(
    loaded: LoadedModel, prompt_ids: list[list[int]], params: SamplingParams
) -> EngineConfig:
    """Every prompt runs in one batch: the limit pinned to their number, room for all of them."""
    n = len(prompt_ids)
    tokens = sum(len(ids) + params.max_tokens for ids in prompt_ids)
    args = loaded.args
    kv_bytes_per_token = 2 * args.num_layers * args.num_kv_heads * args.head_dim * 4
    return EngineConfig(
        model_name=loaded.path.name,
        device=str(loaded.device),
        max_num_seqs=n,
        min_num_seqs=n,
        initial_num_seqs=n,
        max_num_batched_tokens=max(2048, n),
        max_queued_requests=n,
        max_queued_tokens=max(tokens, 1),
        request_timeout_s=24 * 3600.0,  # offline work has no client waiting on a deadline
        kv_cache_bytes=max(1 << 30, 2 * tokens * kv_bytes_per_token),
        # the limit is pinned and nothing reads a utilization: the load-time sweep (64 sequences'
        # worth of steps, ~10x a short generate on the demo models) would buy nothing
        batch_warmup=False,
    )
