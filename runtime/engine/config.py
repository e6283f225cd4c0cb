"""The engine's one config object, derived from runtime.config.Settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.engine.batching.controller import BatchPolicyConfig
from runtime.engine.constraints.limits import GrammarLimits
from runtime.engine.fair_share import ShareConfig
from runtime.engine.lora.registry import LoraLimits
from runtime.engine.scheduled import SchedulerConfig
from runtime.engine.spec.config import SpecConfig
from runtime.errors import ConfigError
from runtime.memory.host_heap import MMAP_THRESHOLD_MAX
from runtime.models.dense_batch import DENSE_MODES
from runtime.models.fast.build import FastPathOptions


@dataclass(frozen=True)
class EngineConfig:
    model_path: Path | None = None  # None: a `loader` must be given to Engine
    model_name: str = ""  # `model` label on stats; defaults to the directory name
    model_version: str = "stable"
    dtype: str = "float32"
    device: str = "auto"
    legacy_support: bool = False
    quantization: str | None = None  # weight-only int8 | int4 | fp8 at load; None: float
    quant_group_size: int = 32  # int4: input features per scale/zero
    quantize_lm_head: bool = False  # with int8/int4: the LM head in int8 per row too
    # intra-op threads of the engine loop's thread (set inside it: OpenMP's thread count is per
    # thread); 0: the physical cores; None: leave what the thread inherits (offline use, tests)
    num_threads: int | None = None
    max_num_seqs: int = 64  # upper bound of the batch (the adaptive limit never exceeds it)
    min_num_seqs: int = 1
    initial_num_seqs: int = 16
    max_num_batched_tokens: int = 2048  # per-step token budget
    max_queued_requests: int = 256
    max_queued_tokens: int = 262144
    request_timeout_s: float = 120.0
    # quantized CPU layers: a dense bf16 copy for calls of many rows (runtime.models.dense_batch):
    # auto | on | off; the copies' byte bound under auto; > 0: from this many rows, unmeasured
    dense_batch_weights: str = "auto"
    dense_batch_max_bytes: int = 1 << 30
    dense_batch_min_rows: int = 0
    compile: str = "auto"  # torch.compile the layers: auto | on | off (runtime.models.fast.build)
    cuda_graphs: str = "auto"  # capture it per batch bucket on CUDA: auto | on | off
    kv_cache_bytes: int = 1 << 30  # the page pool, reserved at build (runtime.memory.kv_pool)
    kv_block_size: int = 16  # tokens per KV page
    enable_prefix_caching: bool = True  # reuse the KV of full pages with the same prefix
    # benchmark only: emulate the pre-paging policy (KV for prompt + max_tokens at first schedule)
    kv_reserve_full_sequence: bool = False
    min_util: float = 0.6
    max_util: float = 0.8
    step_up: float = 0.2
    step_down: float = 0.1
    control_interval_s: float = 1.0
    max_queue_wait_s: float = 1.0  # the controller grows past its band beyond this wait; 0: off
    batch_warmup: bool = True  # at load, a short sweep of batch sizes seeds the step-time model
    idle_wait_s: float = 0.05  # how long the loop sleeps when nothing can run (timeouts still fire)
    heap_trim_interval_s: float = 5.0  # malloc_trim between steps at most this often; 0: never
    heap_mmap_threshold_bytes: int = 0  # fixed glibc mmap threshold (host_heap.py); 0: dynamic
    debug_leak_blocks_per_request: int = 0  # debug: allocator blocks leaked on purpose per request
    grammar: GrammarLimits = field(default_factory=GrammarLimits)  # constraints' bounds
    # root of the compiled step's on-disk caches, a directory per model under it; None:
    # $XDG_CACHE_HOME/fastllm/compile (runtime.models.fast.compile_cache)
    compile_cache_dir: Path | None = None
    scheduling_policy: str = "fcfs"  # fcfs | priority (runtime.engine.priority)
    priority_aging_s: float = 10.0  # priority policy: seconds waited per priority level gained
    # fair share (runtime.engine.fair_share): one API request's / one tenant's sequences hold at
    # most this fraction of the batch's sequence cap while they run; 1.0: unbounded
    max_request_batch_share: float = 1.0
    max_tenant_batch_share: float = 1.0
    spec: SpecConfig = field(default_factory=SpecConfig)  # speculative decoding (off by default)
    # LoRA adapters: registered at load (name, PEFT directory), the resident bound, the rank
    # bound, and the directory adapters must come from (None: anywhere)
    loras: tuple[tuple[str, str], ...] = ()
    max_loras: int = 4
    max_lora_rank: int = 16
    lora_dir: Path | None = None
    # tensor parallelism (runtime.engine.tp): ranks of one model; 1 = this process alone
    tensor_parallel_size: int = 1
    tensor_parallel_timeout_s: float = 60.0  # a collective's longest wait for a rank
    # False: the workers are started elsewhere (LeaderWorkerSet pods) and join MASTER_ADDR:PORT
    tensor_parallel_spawn: bool = True
    tensor_parallel_master_addr: str = "127.0.0.1"
    tensor_parallel_master_port: int = 0  # 0: a free port (spawned workers)

    def __post_init__(self) -> None:
        if self.tensor_parallel_size > 1 and (self.loras or self.spec.method == "self_draft"):
            # neither the adapters' deltas nor the draft model are sharded yet
            what = "LoRA adapters" if self.loras else "speculative_method=self_draft"
            raise ConfigError(
                f"{what} cannot run with tensor_parallel_size > 1 yet",
                param="tensor_parallel_size",
            )
        if not 1 <= self.min_num_seqs <= self.max_num_seqs:
            raise ConfigError("need 1 <= min_num_seqs <= max_num_seqs", param="max_num_seqs")
        if self.max_num_batched_tokens < 1 or self.max_queued_requests < 1:
            raise ConfigError("token budget and queue bound must be positive")
        if self.heap_trim_interval_s < 0:
            raise ConfigError("heap_trim_interval_s must be >= 0", param="heap_trim_interval_s")
        if not 0 <= self.heap_mmap_threshold_bytes <= MMAP_THRESHOLD_MAX:
            raise ConfigError(
                f"heap_mmap_threshold_bytes must be 0 (glibc's dynamic threshold) or at most "
                f"{MMAP_THRESHOLD_MAX} (glibc's limit), got {self.heap_mmap_threshold_bytes}",
                param="heap_mmap_threshold_bytes",
            )
        if self.kv_block_size < 1:
            raise ConfigError("kv_block_size must be >= 1", param="kv_block_size")
        if self.dense_batch_weights not in DENSE_MODES:
            raise ConfigError(
                f"dense_batch_weights must be one of {', '.join(DENSE_MODES)}",
                param="dense_batch_weights",
            )
        if self.dense_batch_min_rows < 0 or self.dense_batch_max_bytes < 0:
            raise ConfigError(
                "dense_batch_min_rows and dense_batch_max_bytes must be >= 0",
                param="dense_batch_min_rows",
            )
        if self.request_timeout_s <= 0:
            raise ConfigError("request_timeout_s must be positive", param="request_timeout_s")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ConfigError(
                "scheduling_policy must be fcfs or priority", param="scheduling_policy"
            )
        for name in ("max_request_batch_share", "max_tenant_batch_share"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(f"{name} must be in (0, 1]", param=name)
        if self.spec.method == "self_draft" and self.quantization == self.spec.draft_quant:
            raise ConfigError(
                f"speculative_method=self_draft with quantization={self.quantization}: the draft "
                f"(speculative_draft_quant={self.spec.draft_quant}) would be the served weights",
                param="speculative_draft_quant",
            )
        if self.max_loras < 1 or self.max_lora_rank < 1:
            raise ConfigError("max_loras and max_lora_rank must be >= 1", param="max_loras")
        self.batch_policy  # validates the band  # noqa: B018
        self.fast_path  # validates compile / cuda_graphs  # noqa: B018

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> EngineConfig:
        fields = {
            "model_path": Path(settings.model_path),
            "model_name": settings.served_model_name,
            "model_version": settings.model_version,
            "dtype": settings.dtype,
            "device": settings.device,
            "legacy_support": settings.legacy_support,
            "quantization": None if settings.quantization == "none" else settings.quantization,
            "quant_group_size": settings.quant_group_size,
            "quantize_lm_head": settings.quantize_lm_head,
            "num_threads": settings.num_threads,
            "max_num_seqs": settings.max_num_seqs,
            "min_num_seqs": settings.min_num_seqs,
            "initial_num_seqs": settings.initial_num_seqs,
            "max_num_batched_tokens": settings.max_num_batched_tokens,
            "max_queued_requests": settings.max_queued_requests,
            "max_queued_tokens": settings.max_queued_tokens,
            "request_timeout_s": settings.request_timeout_s,
            "kv_cache_bytes": settings.kv_cache_bytes,
            "compile": settings.compile,
            "dense_batch_weights": settings.dense_batch_weights,
            "dense_batch_max_bytes": settings.dense_batch_max_bytes,
            "dense_batch_min_rows": settings.dense_batch_min_rows,
            "cuda_graphs": settings.cuda_graphs,
            "kv_block_size": settings.kv_block_size,
            "enable_prefix_caching": settings.enable_prefix_caching,
            "min_util": settings.min_util,
            "max_util": settings.max_util,
            "step_up": settings.step_up,
            "step_down": settings.step_down,
            "control_interval_s": settings.control_interval_s,
            "max_queue_wait_s": settings.max_queue_wait_s,
            "batch_warmup": settings.batch_warmup,
            "heap_trim_interval_s": settings.heap_trim_interval_s,
            "heap_mmap_threshold_bytes": settings.heap_mmap_threshold_bytes,
            "debug_leak_blocks_per_request": settings.debug_leak_blocks_per_request,
            "grammar": GrammarLimits.from_settings(settings),
            "compile_cache_dir": settings.compile_cache_dir,
            "scheduling_policy": settings.scheduling_policy,
            "priority_aging_s": settings.priority_aging_s,
            "max_request_batch_share": settings.max_request_batch_share,
            "max_tenant_batch_share": settings.max_tenant_batch_share,
            "spec": SpecConfig.from_settings(settings),
            "loras": tuple(settings.lora_modules().items()),
            "max_loras": settings.max_loras,
            "max_lora_rank": settings.max_lora_rank,
            "lora_dir": settings.lora_dir,
            "tensor_parallel_size": settings.tensor_parallel_size,
            "tensor_parallel_timeout_s": settings.tensor_parallel_timeout_s,
            "tensor_parallel_spawn": settings.tensor_parallel_spawn,
            "tensor_parallel_master_addr": settings.tensor_parallel_master_addr,
            "tensor_parallel_master_port": settings.tensor_parallel_master_port,
        }
        fields.update(overrides)
        return cls(**fields)

    @property
    def effective_max_num_seqs(self) -> int:
        """A step feeds at least one token per running sequence, so the budget caps the batch."""
        return min(self.max_num_seqs, self.max_num_batched_tokens)

    @property
    def fast_path(self) -> FastPathOptions:
        return FastPathOptions(
            compile=self.compile,
            cuda_graphs=self.cuda_graphs,
            max_batch=self.effective_max_num_seqs,
            cache_dir=self.compile_cache_dir,
        )

    @property
    def lora_limits(self) -> LoraLimits:
        return LoraLimits(self.max_loras, self.max_lora_rank, self.lora_dir)

    @property
    def batch_policy(self) -> BatchPolicyConfig:
        return BatchPolicyConfig.from_settings(self, max_batch=self.effective_max_num_seqs)

    @property
    def scheduler(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_queued_requests=self.max_queued_requests,
            max_queued_tokens=self.max_queued_tokens,
            reserve_full_sequence=self.kv_reserve_full_sequence,
            scheduling_policy=self.scheduling_policy,
            priority_aging_s=self.priority_aging_s,
            share=ShareConfig(self.max_request_batch_share, self.max_tenant_batch_share),
        )
