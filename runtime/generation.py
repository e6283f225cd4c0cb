"""A static-batch generation loop: the CLI, the parity tests and the benchmark use it; the
engine has its own continuous-batching loop built from the same pieces (sample, StopChecker).

All prompts are prefilled in one packed forward (each its own `SeqSlice` and `SequenceKV`);
then every decode step packs the unfinished sequences' last tokens into one forward. The
sampled ids come back to the host once per step (the stop checks need them); the next step's
input ids stay on the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

from runtime.errors import InvalidRequestError
from runtime.kv_cache import SequenceKV
from runtime.models.base import CausalLM, SeqSlice
from runtime.models.tokenizer import Tokenizer
from runtime.sampling import SamplingParams, make_generator, sample
from runtime.stopping import StopChecker

if TYPE_CHECKING:
    from runtime.models.loader import LoadedModel

__all__ = ["GenerationResult", "generate", "tokenize_prompt"]


@dataclass
class GenerationResult:
    token_ids: list[int]  # completion ids, incl. the eos / stop token that ended it
    text: str  # completion text; a matched stop string and what follows it are cut
    finished_reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int


def tokenize_prompt(
    tokenizer: Tokenizer,
    prompt: str | Sequence[int],
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
    if len(ids) >= context:
        raise InvalidRequestError(
            f"prompt is {len(ids)} tokens; this model's context is {context} tokens", param="prompt"
        )
    if len(ids) + max_tokens > context:
        raise InvalidRequestError(
            f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds this model's "
            f"context of {context} tokens",
            param="max_tokens",
        )
    return ids


def generate(
    loaded: LoadedModel, prompts: Sequence[str | Sequence[int]], params: SamplingParams
) -> list[GenerationResult]:
    params.validate()
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
    with torch.inference_mode():
        return _run(loaded, tokenizer, prompt_ids, params)


def _run(
    loaded: LoadedModel, tokenizer: Tokenizer, prompt_ids: list[list[int]], params: SamplingParams
) -> list[GenerationResult]:
    model, args, device = cast(CausalLM, loaded.model), loaded.args, loaded.device
    kvs = [
        SequenceKV.empty(
            args.num_layers,
            args.num_kv_heads,
            args.head_dim,
            capacity=len(ids) + params.max_tokens,
            dtype=loaded.dtype,
            device=device,
        )
        for ids in prompt_ids
    ]
    checkers = [StopChecker(tokenizer, params, ids) for ids in prompt_ids]
    generators = [make_generator(params.seed, device) for _ in prompt_ids]
    outputs: list[list[int]] = [[] for _ in prompt_ids]
    texts: list[list[str]] = [[] for _ in prompt_ids]

    # prefill: all prompts back to back; logits only for each prompt's last position
    slices, start = [], 0
    for ids, kv in zip(prompt_ids, kvs, strict=True):
        slices.append(SeqSlice(start=start, end=start + len(ids), kv=kv))
        start += len(ids)
    flat = torch.tensor([t for ids in prompt_ids for t in ids], dtype=torch.long, device=device)
    hidden = model(flat, slices)  # [T, hidden]
    last = torch.tensor([s.end - 1 for s in slices], device=device)
    logits = model.compute_logits(hidden[last])  # [N, vocab]
    for s in slices:
        s.kv.advance(s.end - s.start)

    alive = list(range(len(prompt_ids)))
    while True:
        tokens = sample(logits, [params] * len(alive), [generators[i] for i in alive])  # [n]
        still, keep_rows = [], []
        for row, (i, token_id) in enumerate(zip(alive, tokens.tolist(), strict=True)):
            outputs[i].append(token_id)
            delta, reason = checkers[i].push(token_id)
            texts[i].append(delta)
            if reason is None:
                still.append(i)
                keep_rows.append(row)
        if not still:
            break
        if len(still) < len(alive):
            tokens = tokens[torch.tensor(keep_rows, device=device)]
        alive = still
        slices = [SeqSlice(start=j, end=j + 1, kv=kvs[i]) for j, i in enumerate(alive)]
        logits = model.compute_logits(model(tokens, slices))  # [n, vocab]
        for i in alive:
            kvs[i].advance(1)

    return [
        GenerationResult(
            token_ids=outputs[i],
            text="".join(texts[i]),
            finished_reason=checkers[i].finished_reason or "length",
            prompt_tokens=len(prompt_ids[i]),
            completion_tokens=len(outputs[i]),
        )
        for i in range(len(prompt_ids))
    ]
