"""Intra-op threads for the threads that run model ops.

OpenMP's thread count is a per-thread setting: `torch.set_num_threads` called on the main thread
does not reach a thread that is already running (the engine loop, the verifier), so each of those
applies the configured count itself when it starts (`apply_num_threads`). 0 means the physical
cores: on a 2-core machine with hyper-threads the logical count would oversubscribe.
"""

from __future__ import annotations

import os

import psutil
import torch

from runtime.errors import ConfigError


def resolve_num_threads(num_threads: int) -> int:
    """The count to use: `num_threads`, or the physical cores when it is 0."""
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 0:
        raise ConfigError(
            "num_threads must be an integer >= 0 (0: physical cores)", param="num_threads"
        )
    if num_threads:
        return num_threads
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def apply_num_threads(num_threads: int) -> int:
    """Set the calling thread's intra-op thread count; returns what torch now reports."""
    torch.set_num_threads(resolve_num_threads(num_threads))
    return torch.get_num_threads()
