"""What the core does when a step or its scheduling fails (under the core's lock): a failed step
fails its requests, not the engine; device memory running out preempts instead when it can."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from runtime.engine.scheduled import SchedulerOutput
from runtime.engine.stats import FailureReason
from runtime.errors import EngineInternalError, ServiceUnavailable

if TYPE_CHECKING:
    from runtime.engine.core_view import CoreView

__all__ = ["WorkersLost", "fail_batch", "fail_live", "fail_lost", "recover_oom"]

log = logging.getLogger("runtime.engine.core")  # where these were logged before the split


def recover_oom(core: CoreView, batch: SchedulerOutput, cause: Exception) -> None:
    """Device memory ran out inside the forward (activations, not KV): preempt the newest
    running sequence (free its KV, requeue it for recompute) and retry the rest next step.
    A sequence alone in the batch cannot make room by waiting: it fails."""
    for item in batch.items:  # no cursor moved: the step's tokens are fed again
        if item.seq.is_closed:
            core.scheduler.finish(item.seq)
    live = [s for s in core.scheduler.running if not s.is_closed]
    if len(live) <= 1:
        fail_batch(core, batch, cause)
        return
    log.warning("out of memory in a step of %d sequences; preempting the newest", len(live))
    core.scheduler.preempt(live[-1])
    core.num_preemptions += 1


def fail_live(core: CoreView, cause: Exception) -> None:
    """Scheduling raised: fail every live request (its state is no longer trusted) with a
    typed error, free what can be freed, and keep the loop running for new requests."""
    log.error("engine scheduling failed; failing %d live requests", len(core.seqs), exc_info=cause)
    message = f"engine scheduling failed: {type(cause).__name__}: {cause}"
    cause = cause.with_traceback(None)  # its frames may hold views of KV pages
    for seq in list(core.seqs.values()):
        error = EngineInternalError(message)
        error.__cause__ = cause
        core.close(seq, error=error, failure_reason=FailureReason.INTERNAL)
        try:
            core.scheduler.finish(seq)
        except Exception:  # already out of the scheduler's queues, or its state is broken
            log.warning("could not release %s after the failure", seq.request_id)


def fail_batch(core: CoreView, batch: SchedulerOutput, cause: Exception) -> None:
    message = f"engine step failed: {type(cause).__name__}: {cause}"
    for item in batch.items:
        error = EngineInternalError(message)
        error.__cause__ = cause
        core.close(item.seq, error=error, failure_reason=FailureReason.INTERNAL)
        core.scheduler.finish(item.seq)  # also those closed during the forward


class WorkersLost(ServiceUnavailable):
    """The step's tensor-parallel workers died (runtime.engine.tp): the KV they held for every
    live sequence is gone, so every live request fails with this 503 and `reset_kv` drops what
    rank 0 still believes is cached."""

    def __init__(self, message: str, reset_kv: Callable[[], object]) -> None:
        super().__init__(message)
        self.reset_kv = reset_kv


def fail_lost(core: CoreView, cause: WorkersLost) -> None:
    log.error("tensor-parallel workers lost; failing %d live requests", len(core.seqs))
    for seq in list(core.seqs.values()):
        error = WorkersLost(str(cause), cause.reset_kv)
        error.__cause__ = cause.__cause__
        core.close(seq, error=error, failure_reason=FailureReason.INTERNAL)
        try:
            core.scheduler.finish(seq)
        except Exception:  # already out of the scheduler's queues
            log.warning("could not release %s after the workers were lost", seq.request_id)
    cause.reset_kv()
