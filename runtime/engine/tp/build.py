"""Building a tensor-parallel engine's pieces: the checks, the workers and rank 0's shard (in
the engine's call-once load). Rank 0's runner is built one level up (runtime.engine.tp_runner).
The engine's settings are read through a protocol (what runtime.engine.config.EngineConfig
holds), so this package does not import the engine's config (nor what it imports)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed

from runtime.engine.tp.messages import WorkerSpec
from runtime.engine.tp.world import TPWorld
from runtime.errors import ConfigError
from runtime.memory.kv_cache import KVCache
from runtime.models.config import ModelArgs
from runtime.models.gguf_io.reader import is_gguf
from runtime.models.loader import LoadedModel, read_args, resolve_device
from runtime.models.parallel.load import load_shard
from runtime.models.parallel.shard import ShardSpec, check_tp


class _Settings(Protocol):
    """The settings a tensor-parallel load reads (runtime.engine.config.EngineConfig)."""

    @property
    def model_path(self) -> str | Path | None: ...
    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def legacy_support(self) -> bool: ...
    @property
    def quantization(self) -> str | None: ...
    @property
    def quant_group_size(self) -> int: ...
    @property
    def quantize_lm_head(self) -> bool: ...
    @property
    def num_threads(self) -> int | None: ...
    @property
    def tensor_parallel_size(self) -> int: ...
    @property
    def tensor_parallel_master_addr(self) -> str: ...
    @property
    def tensor_parallel_master_port(self) -> int: ...
    @property
    def tensor_parallel_timeout_s(self) -> float: ...
    @property
    def tensor_parallel_spawn(self) -> bool: ...


def model_args_of(path: Path) -> ModelArgs:
    if is_gguf(path):
        from runtime.models.gguf_io.args import model_args
        from runtime.models.gguf_io.reader import open_gguf

        return model_args(open_gguf(path))
    return read_args(path)


def check(config: _Settings) -> None:
    """Bad sizes as one line (ConfigError), before any process starts."""
    assert config.model_path is not None
    check_tp(model_args_of(Path(config.model_path)), config.tensor_parallel_size)
    device = resolve_device(config.device)
    if device.type == "cuda" and torch.cuda.device_count() < config.tensor_parallel_size:
        raise ConfigError(
            f"tensor_parallel_size {config.tensor_parallel_size} needs as many GPUs; "
            f"{torch.cuda.device_count()} visible",
            param="tensor_parallel_size",
        )


def load_parallel(config: _Settings) -> LoadedModel:
    """Start the workers (they load their shards), then load rank 0's."""
    check(config)
    if torch.distributed.is_initialized():  # its default group is per process
        raise ConfigError(
            "one tensor-parallel engine per process: this one already has a process group "
            "(serve the canary or a second split model from another server)",
            param="tensor_parallel_size",
        )
    assert config.model_path is not None
    device = resolve_device(config.device)
    spec = WorkerSpec(
        model_path=str(config.model_path),
        world=config.tensor_parallel_size,
        master_addr=config.tensor_parallel_master_addr,
        master_port=config.tensor_parallel_master_port,
        timeout_s=config.tensor_parallel_timeout_s,
        dtype=config.dtype,
        device=device.type,
        legacy_support=config.legacy_support,
        quantization=config.quantization,
        quant_group_size=config.quant_group_size,
        quantize_lm_head=config.quantize_lm_head,
        num_threads=config.num_threads or 0,
    )
    world = TPWorld(spec, spawn=config.tensor_parallel_spawn)
    world.start()
    try:
        loaded = load_shard(
            config.model_path,
            ShardSpec(0, spec.world),
            dtype=config.dtype,
            device=spec.device_of(0),
            legacy_support=config.legacy_support,
            quantization=config.quantization,
            quant_group_size=config.quant_group_size,
            quantize_lm_head=config.quantize_lm_head,
        )
    except BaseException:
        world.shutdown()
        raise
    loaded.parallel = world
    return loaded


def memory_rows(loaded: LoadedModel, kv_cache: KVCache) -> list[dict[str, Any]]:
    """Each rank's memory for /admin/memory and fastllm_tp_rank_memory_bytes."""
    assert isinstance(loaded.parallel, TPWorld)
    weights = sum(t.numel() * t.element_size() for t in loaded.model.state_dict().values())
    pool = kv_cache.pool.data
    rows = loaded.parallel.memory(pool.numel() * pool.element_size(), weights)
    return [asdict(row) for row in rows]
