"""`batch_goal`: the latency/throughput trade-off as one word, mapped to the controller's band.

u is the share of the device's saturation throughput delivered (runtime.engine.batching.throughput),
so the band says directly how close to saturation the engine runs (docs/batching.md). Outside
the engine package: the settings use it, and the alerts' evaluator imports the settings.
- latency (0.5-0.7): short steps (low time per output token), about 60% of saturation throughput;
- balanced (0.6-0.8, the default band): the knee of the throughput curve;
- throughput (0.9-1.0): the limit grows until the engine delivers 90% or more of saturation, and
  never shrinks for being near it (nothing reads above 1): longer steps, most tokens per second.
"""

from __future__ import annotations

from typing import Literal

BatchGoal = Literal["latency", "balanced", "throughput"]

BATCH_GOALS: dict[str, tuple[float, float]] = {  # goal -> (min_util, max_util)
    "latency": (0.5, 0.7),
    "balanced": (0.6, 0.8),
    "throughput": (0.9, 1.0),
}


def band_for(goal: str) -> tuple[float, float]:
    """(min_util, max_util) of a goal; KeyError for an unknown one (callers validate first)."""
    return BATCH_GOALS[goal]
