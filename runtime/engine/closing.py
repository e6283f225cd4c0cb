"""How a sequence ends, under the core's lock: `close` (final output, stats, KV freed) and
`expire` (requests past their deadline). `EngineCore` (core.py) inherits them.

A sequence that is cancelled or times out while it is part of the step being executed gets its
final output at once, but its KV is freed right after that forward returns (the forward is still
writing into it); every other sequence's KV is freed in the call itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from runtime.engine import postprocess
from runtime.engine.request import RequestHandle, TokenOutput
from runtime.engine.sequence import Sequence
from runtime.engine.stats import FailureReason, FinishReason, RequestEvent, RequestStats
from runtime.engine.timings import RequestMetrics
from runtime.errors import FastllmError, RequestTimeout

if TYPE_CHECKING:
    from runtime.engine.config import EngineConfig
    from runtime.engine.scheduler import Scheduler


class Closing:
    config: EngineConfig
    scheduler: Scheduler
    seqs: dict[str, Sequence]
    in_flight: set[str]
    records: list[RequestStats]
    final_outputs: list[tuple[RequestHandle, TokenOutput]] | None
    on_close: Callable[[Sequence], None] | None

    def close(
        self,
        seq: Sequence,
        *,
        finished_reason: FinishReason | None = None,
        error: FastllmError | None = None,
        failure_reason: FailureReason | None = None,
        output: TokenOutput | None = None,
    ) -> None:
        """Finish a sequence for good: final output, stats, and its KV freed (see module doc)."""
        if seq.is_closed:
            return
        seq.is_closed = True
        self.seqs.pop(seq.request_id, None)
        cancelled = finished_reason == FinishReason.CANCELLED
        seq.mark(RequestEvent.CANCELLED if cancelled else RequestEvent.FINISHED)
        seq.stats.completion_tokens = len(seq.output_token_ids)
        seq.stats.finished_reason = finished_reason
        seq.stats.failure_reason = failure_reason
        if output is None:
            output = postprocess.empty_output(seq, finished_reason, error)
        if seq.request_id not in self.in_flight:
            self.scheduler.finish(seq)  # KV back before the caller sees the end of the stream
        record = seq.stats if seq.group is None else seq.group.closed(seq)
        if record is not None and seq.request.report_metrics:  # on the request's last output
            output.metrics = RequestMetrics.of(record, seq.request.priority)
        if self.final_outputs is not None:  # pushed once the step's stats are recorded
            self.final_outputs.append((seq.handle, output))
        else:
            seq.handle.push(output)
        if record is not None:  # one record per request, when its last choice closes
            self.records.append(record)
        if self.on_close is not None:
            self.on_close(seq)
        if seq.group is not None and (
            error is not None or finished_reason is FinishReason.CANCELLED
        ):
            for other in seq.group.open_members():  # one choice cancelled or failed: all are
                self.close(
                    other,
                    finished_reason=finished_reason,
                    error=error,
                    failure_reason=failure_reason,
                )

    def expire(self, now: float) -> None:
        for seq in [s for s in self.seqs.values() if s.deadline <= now]:
            limit = seq.request.timeout_s or self.config.request_timeout_s
            error = RequestTimeout(f"request {seq.request_id} did not finish within {limit:g}s")
            self.close(seq, error=error, failure_reason=FailureReason.TIMEOUT)
