"""What the core's helpers (postprocess.py, failures.py) use of `EngineCore`, as a protocol: they
run inside the core's methods, and a type import of the core from them would close an import
cycle (tests/test_layout.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from runtime.engine.request import TokenOutput
    from runtime.engine.scheduler import Scheduler
    from runtime.engine.sequence import Sequence
    from runtime.engine.stats import FailureReason, FinishReason
    from runtime.errors import FastllmError


class CoreView(Protocol):
    scheduler: Scheduler
    seqs: dict[str, Sequence]
    num_preemptions: int

    def close(
        self,
        seq: Sequence,
        *,
        finished_reason: FinishReason | None = None,
        error: FastllmError | None = None,
        failure_reason: FailureReason | None = None,
        output: TokenOutput | None = None,
    ) -> None: ...
