"""A constrained request waits for its grammar outside the scheduler.

While its compile runs (cache.py's worker thread) the sequence is live (`core.seqs`: it can be
cancelled and it times out) but not queued, so no step schedules it and no step waits for it;
the compile's completion queues it under the core lock. A compile that fails (the parse at
validation passed, so this is rare) fails the request with a typed error.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING

from runtime.engine.constraints.cache import Compiled
from runtime.engine.stats import FailureReason
from runtime.errors import InvalidRequestError, ServiceUnavailable

if TYPE_CHECKING:
    from runtime.engine.core import EngineCore
    from runtime.engine.sequence import Sequence

__all__ = ["add_when_compiled"]


def add_when_compiled(core: EngineCore, seq: Sequence) -> None:
    """Under core.lock: queue `seq` now if its grammar is ready, else when it is."""
    state = seq.constraint
    assert state is not None
    if state.future.done():
        _queue(core, seq)
        return
    core.seqs[seq.request_id] = seq  # live: cancel and the deadline reach it

    def compiled(_: Future[Compiled]) -> None:  # on the compile thread
        with core.lock:
            if not seq.is_closed:
                _queue(core, seq)

    state.future.add_done_callback(compiled)


def _queue(core: EngineCore, seq: Sequence) -> None:
    state = seq.constraint
    assert state is not None
    try:
        state.bind()
    except ServiceUnavailable as exc:  # the server shuts down (its workers are killed)
        core.seqs[seq.request_id] = seq
        core.close(seq, error=exc, failure_reason=FailureReason.INTERNAL)
        return
    except Exception as exc:  # refused by the engine, or past its compile budget
        core.seqs[seq.request_id] = seq
        error = InvalidRequestError(
            f"{state.spec.param}: the grammar did not compile: {exc}", param=state.spec.param
        )
        core.close(seq, error=error, failure_reason=FailureReason.VALIDATION)
        return
    core.add(seq)
