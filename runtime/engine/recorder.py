"""The sinks off the engine thread (as vLLM v1 ships `SchedulerStats` out of its core): each step
hands its stats dataclasses to a bounded queue and goes on; one recorder thread per engine fans
them out to the sink (Prometheus, OpenTelemetry, `inference_log`, rollout, ...).

Metrics stay exact for anyone who watches a request end: the final outputs a step produced
travel with that step's stats and the recorder pushes them to their handles only after the sink
has recorded the step, so a request's end is seen after its numbers are in. A full queue (a sink
slower than the engine) drops the step's stats, counted in `num_dropped`, never an output: those
are pushed at once. `flush` waits until everything queued so far is recorded; `close` flushes
and stops the thread (the engine's shutdown). A `prepare` hook runs on the recorder's thread for
each step before the sink sees it: the engine's own consumers of step figures (the batch policy's
step-time model, the allocator's report) run there too, off the step loop; a dropped step is
dropped for them as well.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from runtime.engine.request import RequestHandle, TokenOutput
from runtime.engine.stats import RequestStats, StatsSink, StepStats

__all__ = ["StatsRecorder"]

log = logging.getLogger(__name__)

DEFAULT_QUEUE_SIZE = 4096  # steps; a queue this deep means the sink cannot keep up


@dataclass
class _Entry:
    step: StepStats | None
    finished: Sequence[RequestStats]
    outputs: Sequence[tuple[RequestHandle, TokenOutput]]  # pushed once the stats are recorded
    failed: bool = False  # the step raised (its outputs are its requests' errors)


@dataclass
class _Marker:
    """Through the queue behind everything submitted before it: set when it comes out."""

    done: threading.Event


class StatsRecorder:
    def __init__(
        self,
        sink: StatsSink,
        *,
        max_queued: int = DEFAULT_QUEUE_SIZE,
        prepare: Callable[[StepStats, bool], StepStats] | None = None,
    ) -> None:
        self.sink = sink
        # (step, failed) -> the step the sink records; on this thread, before the sink
        self.prepare = prepare
        self._queue: queue.Queue[_Entry | _Marker | None] = queue.Queue(maxsize=max_queued)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.num_recorded = 0  # entries handed to the sink
        self.num_dropped = 0  # entries whose stats were dropped: the queue was full or closed
        self.num_sink_errors = 0  # record() calls that raised (isolated: logged, counted)

    def submit(
        self,
        step: StepStats | None,
        finished: Sequence[RequestStats] = (),
        outputs: Sequence[tuple[RequestHandle, TokenOutput]] = (),
        *,
        failed: bool = False,
    ) -> None:
        """From the engine thread: never blocks, never raises."""
        if not finished and step is None and not outputs:
            return
        with self._lock:
            if not self._closed:
                self._start()
                try:
                    self._queue.put_nowait(_Entry(step, finished, outputs, failed))
                    return
                except queue.Full:
                    pass
            self.num_dropped += 1
        _push(outputs)  # the stats may go, the outputs never

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every entry submitted so far is recorded and its outputs pushed; False
        when `timeout_s` passed first."""
        with self._lock:
            if self._thread is None or self._closed:
                return True
        marker = _Marker(threading.Event())
        try:
            self._queue.put(marker, timeout=timeout_s)
        except queue.Full:
            return False
        return marker.done.wait(timeout_s)

    def close(self, timeout_s: float | None = 10.0) -> None:
        """Flush, then stop the thread; later submits push their outputs and count a drop."""
        self.flush(timeout_s)
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout_s)

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fastllm-stats", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            entry = self._queue.get()
            if entry is None:  # close(): everything before it was recorded
                return
            if isinstance(entry, _Marker):
                entry.done.set()
                continue
            step = entry.step
            if step is not None and self.prepare is not None:
                step = self._prepared(step, entry.failed)
            try:
                self.sink.record(step=step, finished=entry.finished)
                self.num_recorded += 1
            except Exception:  # telemetry must never stop the engine's outputs
                self.num_sink_errors += 1
                log.exception("stats sink failed")
            finally:
                _push(entry.outputs)

    def _prepared(self, step: StepStats, failed: bool) -> StepStats:
        assert self.prepare is not None
        try:
            return self.prepare(step, failed)
        except Exception:  # the step is still recorded, as the engine made it
            self.num_sink_errors += 1
            log.exception("stats prepare hook failed")
            return step


def _push(outputs: Sequence[tuple[RequestHandle, TokenOutput]]) -> None:
    for handle, output in outputs:
        handle.push(output)
