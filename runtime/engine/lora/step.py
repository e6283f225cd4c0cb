"""A step with adapters: its rows ordered so that each adapter's rows are one contiguous run of
the packed batch (base rows first), and the groups the model's LoRA forward adds deltas to.

The order is a stable sort by adapter, so rows keep their relative order inside a group; the
runner puts the step's outputs back in the scheduler's order afterwards. The rows are read
through a protocol (what `runtime.engine.scheduled.ScheduledSeq` holds), so this package does not
import the scheduler's batch or the sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from runtime.engine.lora.registry import ResidentAdapter
from runtime.models.batch_plan import SeqSlice
from runtime.models.lora import LoraGroup

if TYPE_CHECKING:
    from runtime.engine.features import SeqFeatures

__all__ = ["arrange", "groups_of"]


class _Seq(Protocol):
    @property
    def features(self) -> SeqFeatures | None: ...


class _Item(Protocol):
    """A row of the step (runtime.engine.scheduled.ScheduledSeq)."""

    @property
    def seq(self) -> _Seq: ...


def _adapter(item: _Item) -> ResidentAdapter | None:
    features = item.seq.features
    return None if features is None else features.lora


def arrange(items: Sequence[_Item]) -> tuple[list[int], list[ResidentAdapter | None]]:
    """(order, adapter of each row in that order): items[order[j]] is row j."""
    adapters = [_adapter(item) for item in items]
    keys = ["" if adapter is None else adapter.key for adapter in adapters]
    order = sorted(range(len(items)), key=keys.__getitem__)
    return order, [adapters[i] for i in order]


def groups_of(
    slices: Sequence[SeqSlice], adapters: Sequence[ResidentAdapter | None]
) -> list[LoraGroup]:
    """One group per adapter over its rows' tokens (contiguous after `arrange`)."""
    groups: list[LoraGroup] = []
    current: ResidentAdapter | None = None
    for piece, adapter in zip(slices, adapters, strict=True):
        if adapter is None or piece.end == piece.start:
            continue
        if adapter is current and groups and groups[-1].end == piece.start:
            groups[-1] = LoraGroup(groups[-1].start, piece.end, adapter.weights)
        else:
            groups.append(LoraGroup(piece.start, piece.end, adapter.weights))
        current = adapter
    return groups
