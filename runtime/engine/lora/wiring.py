"""The registry in the engine's parts: built at load (with the configured adapters), found by
admission, and the prefix-cache salt of an adapted request."""

from __future__ import annotations

import json
from typing import Any

from runtime.engine.lora.registry import LoraRegistry
from runtime.errors import ModelNotFoundError

__all__ = ["adapter_owner_ids", "build_registry", "lora_registry", "lora_salt"]


# `config` is the EngineConfig and `parts` the EngineParts (runtime.engine.build imports this
# module: typed loosely so the two do not import each other)
def build_registry(config: Any, parts: Any) -> LoraRegistry | None:
    """The causal LM's registry, with `config.loras` registered (their errors fail the load)."""
    loaded = parts.loaded
    # a split model runs no adapters yet: its delta would need sharding like the base weights
    if not loaded.is_causal_lm or getattr(loaded, "parallel", None) is not None:
        return None
    core = parts.core

    def in_use() -> set[str]:
        with core.lock:  # the loop thread changes `seqs`; a load or an admission reads it
            return {
                seq.features.lora.name
                for seq in core.seqs.values()
                if seq.features is not None and seq.features.lora is not None
            }

    registry = LoraRegistry(
        loaded.args,
        loaded.dtype,
        loaded.device,
        parts.allocator,
        config.lora_limits,
        in_use=in_use,
    )
    for name, path in config.loras:
        registry.register(name, path)
    return registry


def lora_registry(parts: Any, config: Any) -> LoraRegistry:
    registry: LoraRegistry | None = parts.loras
    if registry is None:
        raise ModelNotFoundError(
            f"{config.model_name or 'this model'} serves no LoRA adapters",
            param="model",
            code="model_not_found",
        )
    return registry


def lora_salt(adapter_key: str, salt: str) -> str:
    """A namespace of its own per adapter (JSON keeps the parts apart: no tenant salt can
    spell an adapter's)."""
    return json.dumps(["lora", adapter_key, salt])


def adapter_owner_ids(registry: LoraRegistry | None) -> list[str]:
    """What the idle self-check must count as live for the resident adapters' blocks: their
    owner `lora:<name>` read the way it reads a request's (the part after the last colon).
    Lock-free (it runs under the core lock). An unloaded adapter whose block is still alive
    is then an orphan, as it should be."""
    if registry is None:
        return []
    return [name.rsplit(":", 1)[-1] for name in registry.resident_names]
