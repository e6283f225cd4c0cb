"""What speculative decoding reads and writes of the scheduler's batch, its rows and their
sequences, as protocols: the spec package never imports `runtime.engine.sequence` or
`runtime.engine.scheduled` (the scheduler and the runner hand their own objects in)."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Protocol

from runtime.engine.sampling.rows import Row

if TYPE_CHECKING:
    import torch

    from runtime.engine.spec.state import SpecState
    from runtime.memory.kv_pool import SequenceKV

__all__ = ["SpecBatch", "SpecItem", "SpecSeq"]


class _Record(Protocol):
    """The request's stats record (runtime.engine.stats.RequestStats): the drafts it counts."""

    spec_draft_tokens: int
    spec_accepted_tokens: int


class _Member(Protocol):
    @property
    def stats(self) -> _Record: ...


class _Group(Protocol):
    """n > 1 (runtime.engine.choice_group.ChoiceGroup): members[0] holds the request's record."""

    @property
    def members(self) -> Seq[_Member]: ...


class SpecSeq(Row, Protocol):
    """A sequence that may draft (runtime.engine.sequence.Sequence)."""

    spec: SpecState | None  # set on the sequence's first drafting step (planner.py)

    @property
    def request_id(self) -> str: ...
    @property
    def token_ids(self) -> list[int]: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def num_pending_tokens(self) -> int: ...
    @property
    def kv(self) -> SequenceKV | None: ...
    @property
    def is_closed(self) -> bool: ...
    @property
    def generator(self) -> torch.Generator | None: ...
    @property
    def group(self) -> _Group | None: ...
    @property
    def stats(self) -> _Record: ...
    def token_slice(self, start: int, end: int) -> list[int]: ...


class SpecItem(Protocol):
    """One row of the step (runtime.engine.scheduled.ScheduledSeq)."""

    draft_token_ids: list[int] | None  # the planner sets them, the self-drafter fills them in

    @property
    def seq(self) -> SpecSeq: ...
    @property
    def num_new_tokens(self) -> int: ...
    @property
    def samples(self) -> bool: ...


class SpecBatch(Protocol):
    """The step's batch (runtime.engine.scheduled.SchedulerOutput) and the counts drafting
    moves."""

    num_prefill_tokens: int
    num_decode_tokens: int
    num_attention_pairs: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_emitted_tokens: int

    @property
    def items(self) -> Seq[SpecItem]: ...
    @property
    def num_featured(self) -> int: ...
