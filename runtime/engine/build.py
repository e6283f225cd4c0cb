"""What the engine builds once the model is loaded: allocator, KV cache, scheduler, runner, loop.

The KV cache's page pool is reserved here, in one block of `kv_cache_bytes` from the allocator
(runtime/memory/kv_pool.py says why), and given back by `Engine.shutdown`.

Built inside the call-once load, so a half-built engine is never visible to another thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from runtime.engine.batching.controller import AdaptiveBatchController, BusyTracker
from runtime.engine.batching.step_model import StepTimeModel
from runtime.engine.batching.warmup import WarmupPlan
from runtime.engine.config import EngineConfig
from runtime.engine.constraints.cache import GrammarCache
from runtime.engine.constraints.vocab import tokenizer_info
from runtime.engine.core import EngineCore
from runtime.engine.lora.registry import LoraRegistry
from runtime.engine.lora.wiring import build_registry
from runtime.engine.model_runner import ModelRunner
from runtime.engine.scheduler import Scheduler
from runtime.engine.sequence import Sequence
from runtime.engine.spec.attach import build_speculation
from runtime.engine.stats import StatsSink
from runtime.engine.threads import apply_num_threads
from runtime.engine.warmup import run_warmup
from runtime.errors import ModelLoadError
from runtime.memory import Allocator, get_allocator
from runtime.memory.kv_cache import KVCache
from runtime.models.base import CausalLM
from runtime.models.dense_batch import attach_dense_copies
from runtime.models.fast.build import FastPath, get_fast_path
from runtime.models.loader import LoadedModel, load_model
from runtime.models.quantize import is_quantized
from runtime.models.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class EngineParts:
    loaded: LoadedModel
    tokenizer: Tokenizer
    allocator: Allocator
    kv_cache: KVCache
    controller: AdaptiveBatchController
    core: EngineCore
    embed_lock: threading.Lock = field(
        default_factory=threading.Lock
    )  # one encoder forward at a time
    debug_leaked: list[Any] = field(default_factory=list)  # blocks held on purpose (debug setting)
    grammars: GrammarCache | None = None  # structured output; built at load for a causal LM
    loras: LoraRegistry | None = None  # LoRA adapters (runtime.engine.lora); a causal LM's
    is_causal_lm: bool = field(init=False)  # can it generate: decided once, read per request

    def __post_init__(self) -> None:
        self.is_causal_lm = self.loaded.is_causal_lm


def default_loader(config: EngineConfig) -> Callable[[], LoadedModel]:
    def load() -> LoadedModel:
        if config.model_path is None:
            raise ModelLoadError("no model_path configured and no loader given")
        if config.tensor_parallel_size > 1:  # workers started, rank 0's shard loaded
            from runtime.engine.tp.build import load_parallel

            return load_parallel(config)
        return load_model(
            config.model_path,
            dtype=config.dtype,
            device=config.device,
            legacy_support=config.legacy_support,
            quantization=config.quantization,
            quant_group_size=config.quant_group_size,
            quantize_lm_head=config.quantize_lm_head,
        )

    return load


def build_parts(
    config: EngineConfig,
    loaded: LoadedModel,
    controller: AdaptiveBatchController,
    tracker: BusyTracker,
    sink: StatsSink | None,
    allocator: Allocator | None = None,
) -> EngineParts:
    if loaded.tokenizer is None:
        raise ModelLoadError(f"{loaded.path}: the engine needs the model's tokenizer")
    args = loaded.args
    allocator = allocator or get_allocator(loaded.device)  # one per device, shared by replicas
    kv_cache = KVCache(
        num_layers=args.num_layers,
        num_kv_heads=args.num_kv_heads,
        head_dim=args.head_dim,
        dtype=loaded.dtype,
        device=loaded.device,
        allocator=allocator,
        # an encoder never generates (validate refuses it): a pool of one page, not the budget
        max_bytes=config.kv_cache_bytes if loaded.is_causal_lm else 0,
        page_size=config.kv_block_size,
        enable_prefix_caching=config.enable_prefix_caching,
        model_version=f"{config.model_name}/{config.model_version}",
        owner=f"kv-cache:{config.model_name}/{config.model_version}",
    )
    if isinstance(loaded.model, CausalLM):  # rope rows for what the KV pool can hold, no more
        _limit_context(loaded, kv_cache.max_tokens)
    if loaded.is_causal_lm:  # before anything times a step (warm-up, thread choices)
        _dense_copies(config, loaded)
    if loaded.parallel is not None:  # tensor parallel: rank 0's step sends its inputs along
        from runtime.engine.tp_runner import make_runner

        runner: ModelRunner = make_runner(loaded, kv_cache)
    else:
        runner = ModelRunner(loaded, _fast_path(config, loaded))
    core = EngineCore(
        config,
        Scheduler(config.scheduler, kv_cache),
        runner,
        controller,
        tracker,
        sink,
        allocator_stats=allocator.stats,
    )
    parts = EngineParts(
        loaded,
        loaded.tokenizer,
        allocator,
        kv_cache,
        controller,
        core,
    )
    if config.batch_warmup and loaded.is_causal_lm:  # seeds the step-time model (see warmup)
        plan = WarmupPlan.for_engine(controller.config.max_batch)
        run_warmup(core, loaded.tokenizer, plan, args.vocab_size)
    if config.spec.enabled and loaded.is_causal_lm:  # after the warm-up: it times plain steps
        speculation = build_speculation(
            config.spec,
            kv_cache,
            loaded,
            curve=warmup_curve(controller),
            max_batch=controller.config.max_batch,
        )
        core.scheduler.speculator = speculation.speculator
        core.runner.drafter = speculation.drafter
    if loaded.is_causal_lm:  # XGrammar's view of the vocabulary: once per loaded model
        info = partial(tokenizer_info, loaded.tokenizer, args.vocab_size)  # at the first compile
        parts.grammars = GrammarCache(info, limits=config.grammar)
    parts.loras = build_registry(config, parts)
    if config.debug_leak_blocks_per_request > 0:
        core.on_close = _debug_leaker(parts, config.debug_leak_blocks_per_request)
    return parts


def _dense_copies(config: EngineConfig, loaded: LoadedModel) -> None:
    """Dense bf16 copies of the quantized CPU projections for steps of many rows
    (runtime.models.dense_batch), decided and measured here, once per loaded model."""
    if not is_quantized(loaded.model):
        return
    threads = torch.get_num_threads()  # the caller's count, given back after the measurement
    if config.num_threads is not None:  # measured at the count the loop's steps will run at
        apply_num_threads(config.num_threads)
    try:
        report = attach_dense_copies(
            loaded.model,
            config.dense_batch_weights,
            max_bytes=config.dense_batch_max_bytes,
            min_rows=config.dense_batch_min_rows,
            tensor_parallel=loaded.parallel is not None,
            compiled=config.compile == "on",
        )
    finally:
        torch.set_num_threads(threads)
    if report.num_layers:
        log.info(
            "dense batch copies (dense_batch_weights=%s): %d quantized layers, %.1f MiB bf16, "
            "run from %d rows (decided in %.2f s)",
            report.mode,
            report.num_layers,
            report.bytes / 2**20,
            report.min_rows,
            report.seconds,
        )
    else:
        log.info("dense batch copies: none (%s)", report.reason)


def _limit_context(loaded: LoadedModel, kv_tokens: int) -> None:
    """A context longer than the KV pool is served up to the pool (longer prompts are refused
    with a 400 by the engine's KV check); the rope table is sized to match, not to the header."""
    assert isinstance(loaded.model, CausalLM)
    loaded.model.limit_positions(kv_tokens)
    context = loaded.args.max_position_embeddings
    if context > kv_tokens:
        log.warning(
            "%s: context length %d is beyond this server's KV pool (%d tokens); sequences are "
            "limited to %d tokens (raise kv_cache_bytes for more)",
            loaded.path,
            context,
            kv_tokens,
            kv_tokens,
        )


def _fast_path(config: EngineConfig, loaded: LoadedModel) -> FastPath | None:
    """Built (compiled, captured) here, at load, once per loaded model; never on a request."""
    fast = get_fast_path(loaded, config.fast_path)
    if fast is None:
        log.info("decode step: the model's forward, uncompiled (compile=%s)", config.compile)
    elif fast.fallback_reason is not None:  # cpu_step logged the failure itself
        log.info(
            "decode step: the model's forward, uncompiled (compile=%s fell back after %.2f s)",
            config.compile,
            fast.startup_s,
        )
    else:
        buckets = f", batch buckets {list(fast.buckets)}" if fast.buckets else ""
        log.info(
            "decode step: %s on %s (built in %.2f s, once per loaded model)%s",
            fast.kind,
            loaded.device,
            fast.startup_s,
            buckets,
        )
    return fast


def _debug_leaker(parts: EngineParts, num_blocks: int) -> Callable[[Sequence], None]:
    """Debug aid for the memory-growth alert: hold small blocks per request, never released."""

    def leak(seq: Sequence) -> None:
        for _ in range(num_blocks):
            block = parts.allocator.alloc(
                (1024,), parts.loaded.dtype, owner=f"debug-leak:{seq.request_id}"
            )
            parts.debug_leaked.append(block)

    return leak


def warmup_curve(controller: AdaptiveBatchController) -> list[tuple[float, float]]:
    """(tokens, seconds) of the warm-up sweep's plain steps (one knot per batch size, each a mean
    of its steps: one-token rows, so tokens = rows); empty without a sweep."""
    model = getattr(controller.source, "model", None)
    if not isinstance(model, StepTimeModel):
        return []
    fit = model.fit()
    if fit is None:
        return []
    return [(knot.features[0], knot.seconds) for knot in fit.reference if knot.seconds > 0]
