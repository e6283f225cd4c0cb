"""Whether a body's prompts × choices can be queued, decided before any of them is (issue 39,
item 5: 32 prompts × n 16 = 512 sequences against a queue of 256 got a retryable 429 after its
first 16 prompts were queued and cancelled, 17 rows a refusal).

A body that can never be queued (more sequences than the queue holds, or more prompt tokens
than it holds) is a 400 naming the bound: retrying cannot help. One that could, but not now (the
queue is busy), is a 429 with nothing queued. The engine still checks each prompt as it comes
(runtime.engine.scheduler.admission_refusal): another client may fill the queue meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.engine.request import context_room
from runtime.errors import InvalidRequestError, Overloaded


def check_batch_fits(
    engine: Any, settings: Any, prompts: list[list[int]], num_seqs_per_prompt: int
) -> None:
    """`engine`: the route's EngineClient (its `num_waiting`, and its own queue bounds when it
    has a config: tests build engines with their own); `settings`: the server's."""
    if len(prompts) < 2:
        return  # one request: the engine's own check (alone, it may take the whole queue)
    bounds = getattr(engine, "config", None) or settings
    total = len(prompts) * num_seqs_per_prompt
    queue = int(bounds.max_queued_requests)
    if total > queue:
        raise InvalidRequestError(
            f"{len(prompts)} prompts × {num_seqs_per_prompt} sequences each = {total} "
            f"sequences, more than this server's waiting queue holds ({queue}, "
            "max_queued_requests): send fewer prompts or choices per request",
            param="prompt",
        )
    tokens = sum(len(ids) for ids in prompts)
    queued_tokens = int(bounds.max_queued_tokens)
    if tokens > queued_tokens:
        raise InvalidRequestError(
            f"the prompts hold {tokens} tokens, more than this server's waiting queue holds "
            f"({queued_tokens}, max_queued_tokens): send fewer prompts per request",
            param="prompt",
        )
    waiting = int(engine.num_waiting)
    if waiting + total > queue:
        raise Overloaded(
            f"engine overloaded: waiting queue has room for {queue - waiting} sequences, "
            f"this request needs {total}",
            retry_after_s=1.0,
        )


def check_prompts_fit(
    engine: Any, prompts: list[list[int]], max_tokens_of: Callable[[list[int]], int]
) -> None:
    """Each prompt of a batch against the context and the KV pool, before any is queued: the
    engine refuses such a prompt too, but only once those before it run (and are cancelled)."""
    loaded = engine.loaded
    if len(prompts) < 2 or not loaded.is_causal_lm:
        return
    context = int(loaded.args.max_position_embeddings)
    kv = engine.kv_cache_stats()
    kv_tokens = kv.num_pages * kv.page_size if kv.num_pages and kv.page_size else None
    for k, ids in enumerate(prompts):
        room, max_tokens = context_room(context, len(ids)), max_tokens_of(ids)
        if room <= 0:
            raise InvalidRequestError(
                f"prompt {k} is {len(ids)} tokens; this model's context is {context} tokens",
                param="prompt",
            )
        if max_tokens > room:
            raise InvalidRequestError(
                f"prompt {k} ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds this "
                f"model's context of {context} tokens",
                param="max_tokens",
            )
        if kv_tokens is not None and len(ids) + max_tokens > kv_tokens:
            raise InvalidRequestError(
                f"prompt {k} + max_tokens ({len(ids) + max_tokens} tokens) does not fit in this "
                f"server's KV cache ({kv_tokens} tokens)",
                param="max_tokens",
            )
