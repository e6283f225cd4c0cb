"""Settings of what is served and how it runs: the checkpoint and its versions, device, dtype,
quantization, the compiled step, LoRA adapters, speculative decoding, tensor parallelism."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator

DEFAULT_DEMO_MODEL_DIR = Path("demo-models/llama-tiny")
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:[0-9]+)?")
_LORA_NAME = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # an adapter name, as `model` carries it


class ModelSettings(BaseModel):
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

    # --- compiled step (runtime.models.fast) ---------------------------------------------------
    compile_cache_dir: Path | None = Field(
        None,
        description="root of the compiled decode step's inductor caches (a directory per model; "
        "default $XDG_CACHE_HOME/fastllm/compile): a restart reuses what the first load compiled",
    )

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
    max_batch_for_speculation: int | None = Field(
        None,
        ge=1,
        description="a step with more sequences than this runs without speculation; unset or "
        "'auto': measured at the batch warm-up (8 with batch_warmup off)",
    )

    # --- tensor parallelism (runtime.engine.tp, docs/deployment.md) ---------------------------
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="ranks one model is split over (1: no tensor parallelism)"
    )
    tensor_parallel_timeout_s: float = Field(60.0, gt=0, le=3600)
    # false: workers run elsewhere (`python -m runtime.engine.tp.worker`, LeaderWorkerSet pods)
    tensor_parallel_spawn: bool = True
    tensor_parallel_master_addr: str = "127.0.0.1"
    tensor_parallel_master_port: int = Field(0, ge=0, le=65535)

    @field_validator("loras", mode="before")
    @classmethod
    def _split_loras(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("max_batch_for_speculation", mode="before")
    @classmethod
    def _auto_spec_batch(cls, value: Any) -> Any:
        # "auto" (or an empty env value) leaves it to the warm-up's measurement
        if isinstance(value, str) and value.strip().lower() in ("auto", ""):
            return None
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

    @property
    def served_model_name(self) -> str:
        path = Path(self.model_path)  # a GGUF file serves as its name without the suffix
        return self.model_name or (path.stem if path.suffix.lower() == ".gguf" else path.name)
