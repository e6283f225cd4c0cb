"""The choices of one request (runtime.engine.choices): who is still open, and the request's one
stats record once the last choice closed. Members are read through a protocol, so this module does
not import `Sequence` (whose `group` field it types)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from runtime.engine.stats import RequestStats

__all__ = ["ChoiceGroup", "ChoiceState"]


class Member(Protocol):
    """What the group reads of a `runtime.engine.sequence.Sequence`."""

    @property
    def is_closed(self) -> bool: ...
    @property
    def output_token_ids(self) -> list[int]: ...
    @property
    def stats(self) -> RequestStats: ...


M = TypeVar("M", bound=Member)


@dataclass(eq=False)
class ChoiceGroup(Generic[M]):
    members: list[M]  # by index; members[0] holds the request's record
    num_open: int

    def open_members(self) -> list[M]:
        return [m for m in self.members if not m.is_closed]

    def closed(self, seq: M) -> RequestStats | None:
        """A member closed: the request's record once it was the last one, else None."""
        self.num_open -= 1
        if self.num_open > 0:
            return None
        stats = self.members[0].stats
        stats.completion_tokens = sum(len(m.output_token_ids) for m in self.members)
        stats.longest_choice_tokens = max(len(m.output_token_ids) for m in self.members)
        stats.batch_size = max(m.stats.batch_size for m in self.members)
        stats.finished_ts = max(m.stats.finished_ts or 0.0 for m in self.members) or None
        failure = next(
            (m.stats.failure_reason for m in self.members if m.stats.failure_reason), None
        )
        if failure is not None:  # one failed choice fails the request
            stats.failure_reason, stats.finished_reason = failure, None
        return stats


@dataclass(eq=False)
class ChoiceState(Generic[M]):
    """A sequence's place among its request's choices (n / best_of > 1 only)."""

    index: int  # which choice it is; 0 holds the request's record
    group: ChoiceGroup[M]
    # on choice 0 until its prefill ends: the choices forked from it when it first samples
    pending_forks: list[M] = field(default_factory=list)
