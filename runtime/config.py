"""The one settings object. Precedence: CLI flags (init kwargs) > FASTLLM_* environment > YAML file
(`FASTLLM_CONFIG` or `--config`) > the embedded defaults below.

Embedded defaults run everything in one process: SQLite file, in-process alert evaluator,
tracing off unless OTEL_EXPORTER_OTLP_ENDPOINT is set, the demo model built locally.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal, get_origin

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from runtime.errors import ConfigError

DEFAULT_DEMO_MODEL_DIR = Path("demo-models/llama-tiny")
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:[0-9]+)?")
_LORA_NAME = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # an adapter name, as `model` carries it


# `batch_goal`: the latency/throughput trade-off as one word, mapped to the controller's band.
# u is the share of the device's saturation throughput delivered
# (runtime.engine.batching.throughput), so the band says how close to saturation the engine runs
# (docs/batching.md): latency (0.5-0.7) short steps, about 60% of saturation throughput;
# balanced (0.6-0.8, the default band) the knee of the throughput curve; throughput (0.9-1.0) the
# limit grows until the engine delivers 90% or more of saturation, and never shrinks for being
# near it (nothing reads above 1). Kept here, outside the engine package: the alerts' evaluator
# imports the settings and may not import the engine.
BatchGoal = Literal["latency", "balanced", "throughput"]

BATCH_GOALS: dict[str, tuple[float, float]] = {  # goal -> (min_util, max_util)
    "latency": (0.5, 0.7),
    "balanced": (0.6, 0.8),
    "throughput": (0.9, 1.0),
}


def band_for(goal: str) -> tuple[float, float]:
    """(min_util, max_util) of a goal; KeyError for an unknown one (callers validate first)."""
    return BATCH_GOALS[goal]


class _EnvSource(EnvSettingsSource):
    """FASTLLM_* variables; a list setting takes JSON (`["a","b"]`) or a comma list (`a,b`)."""

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError:
            if isinstance(value, str) and get_origin(field.annotation) is list:
                return [part.strip() for part in value.split(",") if part.strip()]
            raise


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FASTLLM_", extra="forbid", validate_default=True)

    # --- model -------------------------------------------------------------------------------
    model_path: Path = Field(DEFAULT_DEMO_MODEL_DIR, description="HF-format checkpoint directory")
    model_name: str = Field("", description="name served by the API; defaults to the dir name")
    model_version: str = Field("stable", description="`version` label of this model")
    canary_model_path: Path | None = Field(None, description="second version served side by side")
    canary_version: str = "canary"
    canary_weight: float = Field(0.0, ge=0.0, le=1.0, description="fraction routed to the canary")
    # automatic rollback: the canary's error / operator-anomaly rate may exceed the stable
    # version's by at most these margins over the last `rollout_window_s` (serving/rollout.py)
    rollout_auto_rollback: bool = True
    rollout_window_s: float = Field(300.0, gt=0)
    rollout_min_requests: int = Field(20, ge=1, description="per version, before judging")
    rollout_max_error_rate_delta: float = Field(0.05, ge=0.0, le=1.0)
    rollout_max_anomaly_rate_delta: float = Field(0.05, ge=0.0, le=1.0)
    dtype: str = Field("float32", pattern="^(float32|bfloat16|float16)$")
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N")
    legacy_support: bool = False
    quantization: str = Field(
        "none",
        pattern="^(none|int8|int4|fp8)$",
        description="weight-only quantization of the decoder's linears at load: none | int8 | "
        "int4 (group-wise) | fp8 (CUDA, compute capability >= 8.9)",
    )
    quant_group_size: int = Field(32, description="int4: input features per scale (32-256)")
    quantize_lm_head: bool = Field(
        False,
        description="with int8/int4: the LM head in int8 too (one scale per vocabulary row; "
        "faster decode on small models, at some cost in agreement: docs/quantization.md)",
    )
    num_threads: int = Field(
        0, ge=0, le=1024, description="intra-op threads for model ops; 0: the physical cores"
    )
    embedding_model_path: Path | None = Field(
        None, description="a BERT-family model served beside, for /v1/embeddings"
    )

    # --- engine ------------------------------------------------------------------------------
    max_num_seqs: int = Field(64, ge=1, description="upper bound of the batch (sequences)")
    min_num_seqs: int = Field(1, ge=1)
    initial_num_seqs: int = Field(16, ge=1)
    max_num_batched_tokens: int = Field(2048, ge=16, description="per-step token budget")
    max_queued_requests: int = Field(256, ge=1)
    max_queued_tokens: int = Field(262144, ge=1)
    request_timeout_s: float = Field(120.0, gt=0)
    kv_cache_bytes: int = Field(
        1 << 30, ge=1 << 20, description="the KV page pool, reserved when the model loads"
    )
    kv_block_size: int = Field(16, ge=1, le=1024, description="tokens per KV page")
    enable_prefix_caching: bool = Field(True, description="reuse KV pages of shared prefixes")
    num_replicas: int = Field(1, ge=1, description="engine replicas (work-stealing pool)")
    # what is built around the forward (runtime.models.fast.build): at load, never on a request
    compile: str = Field(
        "auto",
        pattern="^(auto|on|off)$",
        description="auto | on (layers torch.compiled, paid at load) | off (nothing built)",
    )
    cuda_graphs: str = Field(
        "auto", pattern="^(auto|on|off)$", description="capture the decode step per batch bucket"
    )

    # --- allocator (runtime.memory.AllocatorConfig.from_settings) ----------------------------
    allocator_small_max_bytes: int = Field(1 << 20, ge=16, description="small tier: below this")
    allocator_medium_max_bytes: int = Field(10 << 20, ge=16, description="large tier: above this")
    allocator_small_blocks_per_class: int = Field(32, ge=0, description="preallocated per class")
    allocator_medium_cache_bytes: int = Field(256 << 20, ge=0, description="medium LRU cache cap")
    heap_trim_interval_s: float = Field(
        5.0, ge=0.0, description="return free heap pages to the OS this often (0: never)"
    )
    heap_mmap_threshold_bytes: int = Field(
        0,
        ge=0,
        le=32 << 20,  # glibc's limit (memory.host_heap.MMAP_THRESHOLD_MAX); config stays leaf
        description="fix glibc's mmap threshold (flatter RSS, slower); 0: glibc's dynamic one",
    )
    malloc: str = Field(
        "auto",
        pattern="^(auto|jemalloc|glibc)$",
        description="the C allocator `serve` runs on: auto (jemalloc when libjemalloc2 is "
        "installed, preloaded by a re-exec at start), jemalloc (required), glibc",
    )

    # --- adaptive batch policy -----------------------------------------------------------------
    # utilization = share of the device's saturation throughput delivered (docs/batching.md)
    min_util: float = Field(
        0.6, ge=0.0, le=1.0, description="below this utilization the batch limit grows 20%"
    )
    max_util: float = Field(
        0.8,
        ge=0.0,
        le=1.0,
        description="above this utilization the batch limit shrinks 10%; lower it to favour "
        "latency. Raising it alone only stops shrinking: a reading inside the band holds, so to "
        "favour throughput raise min_util too, or use batch_goal throughput (band 0.9-1.0)",
    )
    batch_goal: BatchGoal | None = Field(
        None,
        description="the trade-off as one word, replacing min_util/max_util: latency (0.5-0.7), "
        "balanced (0.6-0.8) or throughput (0.9-1.0: within 10% of the best batch's throughput)",
    )
    step_up: float = Field(0.2, gt=0.0, le=1.0)
    step_down: float = Field(0.1, gt=0.0, le=1.0)
    control_interval_s: float = Field(1.0, gt=0.0)
    batch_warmup: bool = Field(
        True, description="at load, run a few batch sizes to seed the step-time model"
    )

    # --- server ------------------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_keys: list[str] = Field(default_factory=list, description="empty = open")
    admin_token: str | None = Field(None, description="admin endpoints are refused when unset")
    # with api_keys, each key's cached prompt pages are its own (runtime.server.openai.tenancy); on:
    # every key reuses every other's, and learns from cached_tokens what the others sent
    prefix_cache_shared_across_keys: bool = Field(
        False, description="API keys share one prefix cache (default: isolated per key)"
    )
    max_body_bytes: int = Field(1 << 20, ge=1024)
    # a body not received in full within this is answered 408 and its connection closed, so a
    # slow or stalled client cannot hold a worker or the drain
    body_read_timeout_s: float = Field(15.0, gt=0.0)
    drain_grace_s: float = Field(30.0, ge=0.0)
    # after SIGTERM, /ready answers 503 this long while new requests are still served, so a load
    # balancer's health check takes the replica out before it refuses work (compose's HAProxy);
    # 0 under Kubernetes, where the preStop hook gives the Service that time
    drain_unready_s: float = Field(0.0, ge=0.0)
    # connections (runtime.server.edge.connections): a request head longer than this is a 431;
    # one not complete this long after its first byte (or the connection's opening) closes it; an
    # idle kept-alive connection is closed after keep_alive_timeout_s; past max_connections a new
    # connection gets a 503 and is closed
    max_header_bytes: int = Field(32 << 10, ge=1024, le=16 << 20)
    header_read_timeout_s: float = Field(10.0, gt=0.0, le=3600.0)
    keep_alive_timeout_s: float = Field(5.0, gt=0.0, le=3600.0)
    max_connections: int = Field(512, ge=1)
    # the status page's query API (runtime.server.status.query_runner): Prometheus'
    # query.timeout and query.max-samples, a response-size bound and the queries evaluated at once
    query_timeout_s: float = Field(10.0, gt=0.0, le=3600.0)
    query_max_samples: int = Field(500_000, ge=1000)
    query_max_response_bytes: int = Field(16 << 20, ge=1 << 16)
    query_max_concurrency: int = Field(4, ge=1, le=64)
    # other replicas' admin URLs (or a DNS name:port answering one A record per replica): an
    # automatic rollback or any newer rollout event on one replica is adopted by the others
    rollout_peers: list[str] = Field(default_factory=list)
    rollout_peers_dns: str | None = Field(None, description="e.g. runtime:8000 (compose)")
    rollout_sync_interval_s: float = Field(1.0, gt=0, description="peer rollout poll period")
    access_log: bool = Field(True, description="uvicorn's one line per request at INFO")
    # which parts the server wires around the engines (tests and benchmarks switch them off)
    metrics_enabled: bool = True
    tracing_enabled: bool = True
    storage_enabled: bool = True

    # --- monitoring ----------------------------------------------------------------------------
    latency_buckets_s: list[float] = Field(
        default_factory=lambda: [
            0.001,
            0.005,
            0.01,
            0.02,
            0.04,
            0.06,
            0.08,
            0.1,
            0.25,
            0.5,
            0.75,
            1.0,
            2.5,
            5.0,
            7.5,
            10.0,
            20.0,
            40.0,
            80.0,
        ]
    )
    memory_sample_interval_s: float = Field(5.0, gt=0)
    otel_service_name: str = "fastllm"
    trace_sample_ratio: float = Field(1.0, ge=0.0, le=1.0)

    # --- storage / verification ------------------------------------------------------------------
    database_url: str = "sqlite:///var/fastllm.db"
    log_queue_size: int = Field(10000, ge=1)
    log_batch_size: int = Field(256, ge=1)
    # rows still queued when a shutdown's flush (log_close_timeout_s) ran out are kept here and
    # written at the next start; default: beside the SQLite file, or var/ for PostgreSQL
    log_spool_path: Path | None = None
    log_close_timeout_s: float = Field(10.0, ge=0.0)
    retention_days: float = Field(30.0, gt=0)
    verify_sample_rate: float = Field(0.01, ge=0.0, le=1.0)
    verify_queue_size: int = Field(256, ge=1, description="verification jobs waiting; full: drop")
    verify_threshold: float | None = Field(None, description="override per-dtype default")

    # --- alerts ------------------------------------------------------------------------------
    alerts_enabled: bool = True
    # the evaluator's sampling + evaluation period; the status page reads its samples, so its stat
    # panels lag a request by at most this (15 s read 0 requests for 15 s after they were served)
    alerts_interval_s: float = Field(5.0, gt=0)
    alerts_rules_path: Path | None = None
    alerts_webhook_url: str | None = None
    alertmanager_url: str | None = None
    # multiply every rule's `for:` and range windows by this (tests/demos shorten them)
    alerts_time_scale: float = Field(1.0, gt=0)
    debug_leak_blocks_per_request: int = Field(0, ge=0, description="debug: leak blocks on purpose")
    # --- compiled step (runtime.models.fast) ---------------------------------------------------
    compile_cache_dir: Path | None = Field(
        None,
        description="root of the compiled decode step's inductor caches (a directory per model; "
        "default $XDG_CACHE_HOME/fastllm/compile): a restart reuses what the first load compiled",
    )

    # --- structured output: grammar compiles (runtime.engine.constraints.limits) ---------------
    # a compile runs in a worker process, killed past its time or memory budget (its request gets
    # a 400); each tenant (API key, or client address without keys) runs at most
    # grammar_compile_workers_per_tenant compiles at once, so no client holds every worker
    grammar_compile_timeout_s: float = Field(10.0, gt=0.0, le=3600.0)
    grammar_compile_max_memory_bytes: int = Field(1 << 30, ge=64 << 20)
    grammar_compile_workers: int = Field(2, ge=1, le=64)
    grammar_compile_workers_per_tenant: int = Field(1, ge=1, le=64)
    grammar_cache_max_bytes: int = Field(
        64 << 20, ge=0, description="compiled grammars kept, by their measured heap bytes"
    )
    # a constraint past these is a 400 naming its field, before any parse or compile
    grammar_max_regex_chars: int = Field(4096, ge=1)
    grammar_max_schema_bytes: int = Field(64 << 10, ge=2)
    grammar_max_schema_properties: int = Field(1024, ge=1)
    grammar_max_schema_depth: int = Field(32, ge=1, le=1000)
    grammar_max_rules: int = Field(1024, ge=1)
    grammar_max_grammar_bytes: int = Field(64 << 10, ge=1)
    # --- LoRA adapters (runtime.engine.lora, docs/lora.md) --------------------------------------
    loras: list[str] = Field(
        default_factory=list,
        description="NAME=PATH PEFT adapters registered at start (`--lora`, repeatable; env: "
        "comma-separated); requests select one by `model`",
    )
    max_loras: int = Field(4, ge=1, le=1024, description="adapters resident at once (LRU)")
    max_lora_rank: int = Field(16, ge=1, le=1024, description="the largest adapter rank r")
    lora_dir: Path | None = Field(
        None, description="adapters only from under this directory (relative paths inside it)"
    )

    # --- per-request timings and priority scheduling (issue 38) ---------------------------------
    enable_request_metrics: bool = Field(
        False,
        description="add a `metrics` object (queue, prefill, decode seconds, TTFT, mean "
        "inter-token latency, tokens/s, cached prompt tokens) to every response body and final "
        "stream event of /v1/completions, /v1/chat/completions, /v1/responses, /v1/messages",
    )
    scheduling_policy: str = Field(
        "fcfs",
        pattern="^(fcfs|priority)$",
        description="fcfs: first come first served; priority: a request's `priority` (lower runs "
        "first, FIFO within one) orders the waiting queue and picks who is preempted",
    )
    priority_aging_s: float = Field(
        10.0,
        ge=0.0,
        description="priority policy: a waiting request gains one priority level per this many "
        "seconds, so none starves; 0: no aging",
    )
    api_key_priorities: list[int] = Field(
        default_factory=list,
        description="default `priority` per API key, in api_keys' order (missing: 0)",
    )
    # --- heavy work off the event loop (runtime.server.offload, runtime.server.prompts) --------
    # threads rendering chat templates, tokenizing long prompts and serialising large responses
    offload_workers: int = Field(4, ge=1, le=64)
    # a non-streamed completion whose largest possible response (choices × tokens × logprobs
    # alternatives) passes this is a 400 before it runs
    max_response_bytes: int = Field(64 << 20, ge=1 << 16)
    # --- checkpoint chat templates (runtime.models.template_sandbox) ---------------------------
    chat_template_timeout_s: float = Field(1.0, gt=0.0, le=60.0, description="per render")
    chat_template_max_output_chars: int = Field(4 << 20, ge=1 << 10)
    chat_template_max_memory_bytes: int = Field(512 << 20, ge=64 << 20, description="per worker")
    chat_template_workers: int = Field(2, ge=1, le=64, description="renders at once")
    # --- fair share of the batch (runtime.engine.fair_share) ---------------------------------
    # while its sequences run, one API request (a batch's prompts and choices) / one tenant holds
    # at most this fraction of the batch's sequence cap, so the next request finds a slot; the
    # waiting queue admits the least-served tenant and request first
    max_request_batch_share: float = Field(0.9, gt=0.0, le=1.0)
    max_tenant_batch_share: float = Field(1.0, gt=0.0, le=1.0)
    # --- speculative decoding (runtime.engine.spec) ---------------------------------------------
    speculative_method: str = Field(
        "off",
        pattern="^(off|ngram|self_draft)$",
        description="draft k tokens per decode step for the model to verify in the same forward: "
        "ngram (prompt lookup) | self_draft (the model's own weights quantized) | off",
    )
    num_speculative_tokens: int = Field(4, ge=1, le=16, description="k, tokens drafted per step")
    ngram_min: int = Field(2, ge=1, le=64, description="ngram: shortest suffix looked up")
    ngram_max: int = Field(4, ge=1, le=64, description="ngram: longest suffix looked up")
    speculative_draft_quant: str = Field(
        "int4", pattern="^(int4|int8)$", description="self_draft: the draft's weight format"
    )
    max_batch_for_speculation: int = Field(
        8, ge=1, description="a step with more sequences than this runs without speculation"
    )

    @model_validator(mode="after")
    def _check_speculation(self) -> Settings:
        if self.speculative_method == "self_draft" and self.quantization == (
            self.speculative_draft_quant
        ):
            raise ValueError(
                f"speculative_method=self_draft with quantization={self.quantization}: the draft "
                f"(speculative_draft_quant={self.speculative_draft_quant}) would be the served "
                "weights"
            )
        return self

    # --- tensor parallelism (runtime.engine.tp, docs/deployment.md) ---------------------------
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="ranks one model is split over (1: no tensor parallelism)"
    )
    tensor_parallel_timeout_s: float = Field(60.0, gt=0, le=3600)
    # false: workers run elsewhere (`python -m runtime.engine.tp.worker`, LeaderWorkerSet pods)
    tensor_parallel_spawn: bool = True
    tensor_parallel_master_addr: str = "127.0.0.1"
    tensor_parallel_master_port: int = Field(0, ge=0, le=65535)

    @field_validator("api_keys", "rollout_peers", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value

    @field_validator("api_key_priorities", mode="before")
    @classmethod
    def _split_priorities(cls, value: Any) -> Any:
        if isinstance(value, str):  # "2,-1" or "[2, -1]" (a flag, the environment)
            return [k.strip() for k in value.strip().strip("[]").split(",") if k.strip()]
        return value

    @field_validator("loras", mode="before")
    @classmethod
    def _split_loras(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("loras")
    @classmethod
    def _check_loras(cls, value: list[str]) -> list[str]:
        names: set[str] = set()
        for item in value:
            name, sep, path = item.partition("=")
            if not sep or not _LORA_NAME.fullmatch(name.strip()) or not path.strip():
                raise ValueError(f"expected NAME=PATH (NAME of [A-Za-z0-9._:-]), got {item!r}")
            if name.strip() in names:
                raise ValueError(f"adapter name {name.strip()!r} given twice")
            names.add(name.strip())
        return value

    def lora_modules(self) -> dict[str, str]:
        """The `loras` setting as name -> path."""
        return {
            name.strip(): path.strip()
            for name, _, path in (item.partition("=") for item in self.loras)
        }

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if not _DEVICE.fullmatch(value):
            raise ValueError("expected auto, cpu, cuda, cuda:N or mps")
        return value

    @model_validator(mode="after")
    def _check_band(self) -> Settings:
        if self.batch_goal is not None:  # the goal names a band (runtime.config)
            self.min_util, self.max_util = band_for(self.batch_goal)
        if self.min_util >= self.max_util:
            raise ValueError(f"min_util ({self.min_util}) must be below max_util ({self.max_util})")
        if not self.min_num_seqs <= self.max_num_seqs:
            raise ValueError("min_num_seqs must not exceed max_num_seqs")
        if self.grammar_compile_workers_per_tenant > self.grammar_compile_workers:
            raise ValueError(
                "grammar_compile_workers_per_tenant must not exceed grammar_compile_workers"
            )
        return self

    @property
    def served_model_name(self) -> str:
        path = Path(self.model_path)  # a GGUF file serves as its name without the suffix
        return self.model_name or (path.stem if path.suffix.lower() == ".gguf" else path.name)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        env = _EnvSource(settings_cls)  # same prefix and options as the default one
        sources: list[PydanticBaseSettingsSource] = [init_settings, env]
        yaml_path = os.environ.get("FASTLLM_CONFIG")
        if yaml_path:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_path))
        return tuple(sources)


def check_settings_file(path: str | Path) -> None:
    """The --config file (FASTLLM_CONFIG) is readable YAML holding one mapping: anything else
    would surface as a YAML traceback or a TypeError from deep inside pydantic-settings."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc})", param="config") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"--config {path}: malformed YAML{at}", param="config") from None
    if data is not None and not isinstance(data, dict):
        kind = type(data).__name__
        raise ConfigError(
            f"--config {path}: expected a mapping of settings, got a YAML {kind}", param="config"
        )


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build settings; `overrides` are CLI flags (None values are ignored so defaults apply).
    An invalid value from any source is a ConfigError naming the setting and its variable."""
    flags = {k: v for k, v in overrides.items() if v is not None}
    if config_file is None:
        return _validated(flags)
    previous = os.environ.get("FASTLLM_CONFIG")
    os.environ["FASTLLM_CONFIG"] = str(config_file)
    try:
        return _validated(flags)
    finally:
        if previous is None:
            os.environ.pop("FASTLLM_CONFIG", None)
        else:
            os.environ["FASTLLM_CONFIG"] = previous


def _validated(flags: dict[str, Any]) -> Settings:
    yaml_path = os.environ.get("FASTLLM_CONFIG")
    if yaml_path:
        check_settings_file(yaml_path)
    try:
        return Settings(**flags)
    except SettingsError as exc:  # a value a source could not even decode (e.g. bad JSON)
        found = re.search(r'field "(\w+)"', str(exc))
        name = found.group(1) if found else "?"
        raise ConfigError(
            f"invalid setting {name} (FASTLLM_{name.upper()}, --config YAML or flag): {exc}",
            param=name,
        ) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(part) for part in first["loc"]]
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        message = str(first["msg"]).removeprefix("Value error, ")
        if not loc:  # a check across settings (model validator)
            raise ConfigError(f"invalid settings: {message}{more}") from None
        name, item = loc[0], "".join(f"[{part}]" for part in loc[1:])
        raise ConfigError(
            f"invalid setting {name}{item} (FASTLLM_{name.upper()}, --config YAML or flag): "
            f"{message}, got {first.get('input')!r}{more}",
            param=name,
        ) from None
