"""Tiered, view-aware, owner-attributed memory allocator (one per device).

from runtime.memory import Allocator, AllocatorConfig
alloc = Allocator(AllocatorConfig(), device="cpu")
block = alloc.alloc((4, 128), torch.float16, owner="req-42")
block.tensor.zero_()            # [4, 128]
half = block[:2]                # tracked view; released on its own
half.release(); block.release() # memory returns to its tier once no alias is left

Design (block.py, allocator.py, ledger.py): pooled memory lives in slots, each with one
storage and one persistent tensor reused by every handout of that shape; on release the slot goes
back to its pool only if the tensor's and the storage's reference counts show nothing else holds
them (no view, raw alias, storage object, capsule or autograd saved tensor); otherwise it waits on
a pending list, re-probed on the next miss and on collect()/stats()/leak_report(). A Block or
BlockView dropped unreleased queues its slot from `__del__`; it is counted as a leak of its owner
when reclaimed.
"""

from __future__ import annotations

import threading

import torch

from runtime.memory.allocator import Allocator
from runtime.memory.block import Block, BlockView
from runtime.memory.config import LARGE, MEDIUM, SMALL, TIERS, AllocatorConfig
from runtime.memory.host_heap import HeapTrimmer, trim_host_heap
from runtime.memory.report import LeakEvent, LiveBlock

__all__ = [
    "LARGE",
    "MEDIUM",
    "SMALL",
    "TIERS",
    "Allocator",
    "AllocatorConfig",
    "Block",
    "BlockView",
    "HeapTrimmer",
    "LeakEvent",
    "LiveBlock",
    "get_allocator",
    "trim_host_heap",
]

_per_device: dict[str, Allocator] = {}
_registry_lock = threading.Lock()


def get_allocator(
    device: torch.device | str = "cpu", config: AllocatorConfig | None = None
) -> Allocator:
    """The process-wide allocator of `device` (created with `config` on first use)."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    with _registry_lock:
        alloc = _per_device.get(str(dev))
        if alloc is None:
            alloc = _per_device[str(dev)] = Allocator(config, dev)
        return alloc
