"""The engine's step loop on its own thread, as nano-vllm's `step()`: schedule, run, postprocess
(the scheduler's KV bookkeeping, then each sampled token to its sequence), record.

One lock (`self.lock`, a Condition) guards the scheduler, the live sequences and the pending stats;
it is held while scheduling and updating, never during the model forward, so `submit` and
`cancel` from other threads only ever wait for bookkeeping. Stats go to the sink after the update,
outside the lock and outside the forward, to the recorder's thread (recorder.py), which runs the
sinks and then pushes the step's final outputs. How a sequence ends (`close`, `expire`, and when
its KV is freed) is closing.py's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import replace

import torch

from runtime.engine import failures, postprocess
from runtime.engine.batching.controller import AdaptiveBatchController, BusyTracker
from runtime.engine.closing import Closing
from runtime.engine.config import EngineConfig
from runtime.engine.model_runner import ModelRunner, StepOutput
from runtime.engine.recorder import StatsRecorder
from runtime.engine.request import RequestHandle, TokenOutput
from runtime.engine.scheduled import SchedulerOutput
from runtime.engine.scheduler import Scheduler
from runtime.engine.sequence import Sequence
from runtime.engine.stats import (
    AllocatorStats,
    RequestStats,
    StatsSink,
    StepStats,
)
from runtime.engine.threads import (
    StepThreads,
    apply_num_threads,
    release_openmp_workers,
    step_threads_for,
)
from runtime.memory.host_heap import HeapTrimmer, set_mmap_threshold

log = logging.getLogger(__name__)

# the warm-up's thread choices are measured again within this many steps of each size class
# once the loop runs (StepThreads.recheck_within)
WARM_UP_RECHECK_STEPS = 64


class EngineCore(Closing):
    """How a sequence ends (`close`, `expire`) is closing.py's."""

    def __init__(
        self,
        config: EngineConfig,
        scheduler: Scheduler,
        runner: ModelRunner,
        controller: AdaptiveBatchController,
        tracker: BusyTracker,
        sink: StatsSink | None,
        allocator_stats: Callable[[], AllocatorStats] | None = None,
        on_close: Callable[[Sequence], None] | None = None,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.runner = runner
        self.controller = controller
        self.tracker = tracker
        self.sink = sink
        self.allocator_stats = allocator_stats
        self.on_close = on_close  # called under the lock when a sequence closes (debug hooks)
        # called under the lock while idle: (now, num_steps, live request ids); self_check.py
        self.on_idle: Callable[[float, int, Collection[str]], None] | None = None
        self.lock = threading.Condition()
        self.seqs: dict[str, Sequence] = {}  # live (not yet closed) sequences by request id
        self.in_flight: set[str] = set()  # request ids in the step being executed
        self.records: list[RequestStats] = []  # closed requests not yet handed to the sink
        # the sinks run on the recorder's thread (recorder.py); while a step is updated, the
        # final outputs it produces wait here to travel with its stats
        self.recorder: StatsRecorder | None = None  # made by the first emit with a sink
        self.final_outputs: list[tuple[RequestHandle, TokenOutput]] | None = None
        self.num_steps = 0
        self.num_preemptions = 0
        self.tokens_per_s = 0.0  # moving average of processed tokens / step wall time
        self.trimmer = HeapTrimmer(config.heap_trim_interval_s)
        # process-wide, as glibc has one threshold: the last engine built with one sets it
        threshold = config.heap_mmap_threshold_bytes
        if threshold and not set_mmap_threshold(threshold):
            log.warning("heap_mmap_threshold_bytes=%d ignored: no glibc mallopt here", threshold)
        self._stop = False
        self._thread: threading.Thread | None = None
        self.num_threads = 0  # intra-op threads the loop thread runs with (set when it starts)
        self.step_threads: StepThreads | None = None  # per step: one thread or all (threads.py)
        # the same for decode steps on a compiled CPU step (runtime.models.fast.cpu_step): a few
        # fused kernels a layer, not ~20 small ops, so one thread against all is another trade-off
        self.compiled_step_threads: StepThreads | None = None

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        with self.lock:
            if self._thread is None:
                # the steps run on the loop's thread from now on: this one's OpenMP workers
                # (the load, the measurements, the warm-up) would slow its every parallel region
                release_openmp_workers()
                self._thread = threading.Thread(
                    target=self._loop, name="fastllm-engine", daemon=True
                )
                self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        with self.lock:
            self._stop = True
            self.lock.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    @property
    def is_running(self) -> bool:
        """The loop thread is alive (it may still be inside a forward)."""
        return self._thread is not None and self._thread.is_alive()

    # --- called by the Engine (under self.lock) --------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.seqs[seq.request_id] = seq
        for fork in seq.pending_forks:  # live (cancel, timeout) before the scheduler has them
            self.seqs[fork.request_id] = fork
        self.scheduler.add(seq)
        self.lock.notify_all()

    # --- the loop --------------------------------------------------------------------------------
    def _loop(self) -> None:
        # per thread (runtime.engine.threads): the main thread's setting does not reach this one
        if self.config.num_threads is not None:
            apply_num_threads(self.config.num_threads)
        self.num_threads = torch.get_num_threads()
        # the warm-up's choices stand if it ran with the same count, measured again on this
        # thread after a few real steps (threads.py: the warm-up ran under the load's conditions)
        self._step_threads().recheck_within(WARM_UP_RECHECK_STEPS)
        while True:
            with self.lock:
                if self._stop:
                    return
                try:
                    self.expire(time.monotonic())
                    # evaluated after each step, off this thread (learn): here only read
                    batch = self.scheduler.schedule(self.controller.limit)
                except Exception as exc:  # a fault in the bookkeeping must not end the loop:
                    failures.fail_live(self, exc)  # a dead loop would leave every request hanging
                    self.lock.wait(self.config.idle_wait_s)  # a fault every round: no spin
                    continue
                if batch.is_empty:
                    records, self.records = self.records, []
                    if not records:
                        if self.on_idle is not None:
                            self._run_idle_hook()
                        self.lock.wait(self.config.idle_wait_s)
                else:
                    self.in_flight = {item.seq.request_id for item in batch.items}
            if not batch.is_empty:
                self._step(batch)
            elif records:
                self.emit(None, records)
            # between steps and outside the lock: the heap's free pages back to the OS now and
            # then, so RSS follows what is in use instead of the heap's fragmented high-water mark
            self.trimmer.maybe_trim(time.monotonic())

    def _run_idle_hook(self) -> None:
        assert self.on_idle is not None
        try:
            self.on_idle(time.monotonic(), self.num_steps, self.seqs.keys())
        except Exception:  # a diagnostic must never stop the loop
            log.exception("idle self-check failed")

    def step_once(self, limit: int) -> bool:
        """One step in the calling thread (the load-time warm-up, before the loop starts);
        False when nothing could be scheduled."""
        assert self._thread is None, "step_once is for before start()"
        with self.lock:
            batch = self.scheduler.schedule(limit)
            if batch.is_empty:
                return False
            self.in_flight = {item.seq.request_id for item in batch.items}
        self._step(batch)
        return True

    def _step_threads(self, compiled: bool = False) -> StepThreads:
        """The per-step thread policy for the calling thread's count (threads.py); steps on a
        compiled step (`compiled`) are measured apart from the eager forward's."""
        if compiled:
            policy = step_threads_for(self.compiled_step_threads, self.runner.loaded, compiled)
            self.compiled_step_threads = policy
            return policy
        self.step_threads = step_threads_for(self.step_threads, self.runner.loaded)
        return self.step_threads

    def _runs_compiled(self, batch: SchedulerOutput) -> bool:
        """Does this step run on a compiled CPU step (not fallen back)? Its graphs take prefill
        and mixed steps too (`FastPath.runs_prefill`); a CUDA capture only decode steps."""
        fast = getattr(self.runner, "fast_path", None)
        return (
            fast is not None
            and (batch.num_prefill_tokens == 0 or fast.runs_prefill)
            and fast.plan.whole_step
            and not fast.num_compile_fallbacks
        )

    def _step(self, batch: SchedulerOutput) -> None:
        num_tokens = batch.num_prefill_tokens + batch.num_decode_tokens
        if self._runs_compiled(batch):
            step_threads = self.compiled_step_threads or self._step_threads(compiled=True)
        else:
            step_threads = self.step_threads or self._step_threads()
        threads = step_threads.pick(num_tokens)
        started_ts, t0 = time.time(), time.perf_counter()
        error: Exception | None = None
        output: StepOutput | None = None
        try:
            output = self.runner.execute(batch)
        except Exception as exc:  # a failed step fails its requests, not the engine
            log.warning("engine step of %d sequences failed", len(batch.items), exc_info=True)
            # drop the traceback: its frames hold views of the sequences' KV blocks
            error = exc.with_traceback(None)
        busy_s = time.perf_counter() - t0
        if error is None:
            step_threads.observe(num_tokens, threads, busy_s)
        with self.lock:
            self.in_flight = set()
            self.final_outputs = []
            if isinstance(error, torch.OutOfMemoryError):
                failures.recover_oom(self, batch, error)
            elif isinstance(error, failures.WorkersLost):  # tensor parallel: every live KV
                failures.fail_lost(self, error)
            elif error is not None:
                failures.fail_batch(self, batch, error)
            elif output is not None:
                self.update_from_output(batch, output)
            self.num_steps += 1
            self._update_rate(batch, started_ts)
            step = self.scheduler.make_stats(
                batch,
                step_id=self.num_steps,
                num_sampled=0 if output is None else output.num_sampled,
                busy_s=busy_s,
                started_ts=started_ts,
                model=self.config.model_name,
                version=self.config.model_version,
            )
            fast = getattr(self.runner, "fast_path", None)
            if fast is not None and fast.num_compile_fallbacks:
                step = replace(step, compile_fallbacks=fast.num_compile_fallbacks)
            records, self.records = self.records, []
            finals, self.final_outputs = self.final_outputs, None
        self.emit(step, records, finals, failed=error is not None)

    def _update_rate(self, batch: SchedulerOutput, started_ts: float) -> None:
        num_tokens = batch.num_prefill_tokens + batch.num_decode_tokens
        rate = num_tokens / max(time.time() - started_ts, 1e-6)
        self.tokens_per_s = rate if self.num_steps == 1 else 0.8 * self.tokens_per_s + 0.2 * rate

    def emit(
        self,
        step: StepStats | None,
        records: list[RequestStats],
        finals: list[tuple[RequestHandle, TokenOutput]] | None = None,
        *,
        failed: bool = False,
    ) -> None:
        """Hand the stats to the recorder's thread (the final outputs go with them); the batch
        policy learns from the step there too (`learn`), so the step loop runs neither."""
        if self.sink is None:  # the warm-up mutes the sink; outputs still go out
            if step is not None:
                self.learn(step, failed)
            for handle, output in finals or ():
                handle.push(output)
            return
        if self.recorder is None or self.recorder.sink is not self.sink:
            self.recorder = StatsRecorder(self.sink, prepare=self._prepare_step)
        self.recorder.submit(step, records, finals or (), failed=failed)

    def learn(self, step: StepStats, failed: bool) -> None:
        """The step to the batch policy: busy time, the step-time model unless it failed (its
        time says nothing about the cost of its work), then the control law when an interval is
        up. Thread-safe: runs on the recorder's thread; the loop only reads the limit."""
        self.tracker.add_busy(step.busy_seconds)
        if not failed:
            self.controller.observe(step)
        self.controller.maybe_update(time.monotonic())

    def _prepare_step(self, step: StepStats, failed: bool) -> StepStats:
        """The recorder's hook, before the sink: `learn`, then the allocator's figures."""
        self.learn(step, failed)
        if self.allocator_stats is None:
            return step
        return replace(step, allocator=self.allocator_stats())

    def update_from_output(self, batch: SchedulerOutput, output: StepOutput) -> None:
        """Each sampled token to its sequence (runtime.engine.postprocess), under the lock."""
        postprocess.update_from_output(self, batch, output)
