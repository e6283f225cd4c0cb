"""What the sampling batch reads of a sequence, as protocols: the sampling package never imports
`runtime.engine.sequence` (the sequence holds feature state; the batch only reads it)."""

from __future__ import annotations

from collections.abc import Set
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from runtime.engine.features import SeqFeatures
    from runtime.engine.sampling.params import SamplingParams

__all__ = ["Row"]


class _Request(Protocol):
    @property
    def sampling(self) -> SamplingParams: ...


class _Stops(Protocol):
    @property
    def stop_token_ids(self) -> Set[int]: ...


class Row(Protocol):
    """A sequence that samples this step (runtime.engine.sequence.Sequence)."""

    @property
    def request(self) -> _Request: ...
    @property
    def prompt_token_ids(self) -> list[int]: ...
    @property
    def output_token_ids(self) -> list[int]: ...
    @property
    def stop_checker(self) -> _Stops: ...
    @property
    def features(self) -> SeqFeatures | None: ...
