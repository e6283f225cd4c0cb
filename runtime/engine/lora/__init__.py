"""LoRA adapters in the engine: the registry (names, residency, LRU, allocator blocks), its
wiring into the engine's parts, and a step's arrangement of rows by adapter. Imported only where
an adapter is involved: a step without adapters checks one count and runs none of this."""

from runtime.engine.lora.registry import LoraLimits, LoraRegistry, LoraStats, ResidentAdapter

__all__ = ["LoraLimits", "LoraRegistry", "LoraStats", "ResidentAdapter"]
