"""Sampled operator verification, off the hot path.

    verifier = Verifier(fanout, sample_rate=settings.verify_sample_rate)
    engine = Engine(config, sink=fanout, verifier=verifier)    # one verifier may serve many engines

The engine marks a request for verification at admission (`should_verify`: a hash of its id, so the
choice is deterministic and a test can force rate 1.0); the model runner keeps the logit of each
token it samples for such a request; when the request finishes normally the engine hands a
`VerifyJob` (jobs.py) to `submit`, which only puts it on a bounded queue (full: dropped and
counted, never waited for). A worker thread then recomputes the request on the reference path
(fp32, the `*_ref` ops; `runtime.verify.reference`), probes the fast ops against their references
on one layer's inputs (`runtime.verify.probes`) and records every probe as a `VerificationResult`
through the sink: the inference_log writer stores them (the logit probe on the request's own row),
the Prometheus sink counts those beyond the per-dtype threshold. A failure here is logged and
counted; it can never reach the request, which has already been answered. Under tensor parallelism
the job's model is rank 0's shard: the reference gathers the other ranks' layers itself
(runtime.models.parallel.gather).
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from runtime.engine.stats import FinishReason, StatsSink
from runtime.engine.threads import apply_num_threads, release_openmp_workers
from runtime.models.lora.weights import LoraWeights
from runtime.verify.jobs import VerifyJob, verify_jobs

if TYPE_CHECKING:
    from runtime.config import Settings
    from runtime.engine.sequence import Sequence
    from runtime.models.base import CausalLM

__all__ = ["Verifier", "is_sampled"]

log = logging.getLogger(__name__)

# cancelled / failed requests are not checked
_VERIFIED_REASONS = frozenset({FinishReason.STOP, FinishReason.LENGTH})


def is_sampled(request_id: str, rate: float) -> bool:
    """Deterministic per request id: the same id is always (or never) verified at a given rate."""
    if rate <= 0.0:
        return False
    if rate >= 1.0:
        return True
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < rate * 2**64


def _adapter_of(seq: Sequence) -> LoraWeights | None:
    """The LoRA weights the sequence was served with (the reference applies them too)."""
    features = getattr(seq, "features", None)  # a stand-in sequence may have no slot at all
    lora = None if features is None else features.lora
    return None if lora is None else lora.weights


class Verifier:
    """Bounded queue + one worker thread. `sink` may be set after construction (wiring)."""

    def __init__(
        self,
        sink: StatsSink | None = None,
        *,
        sample_rate: float = 0.01,
        queue_size: int = 256,
        max_batch: int = 32,
        on_drop: Callable[[int], None] | None = None,
        autostart: bool = True,
        num_threads: int | None = None,
        threshold: float | None = None,
    ) -> None:
        self.sink = sink
        # the base of every tolerance (runtime.verify.tolerance); None: per model, from its dtype
        # and its layers' quantization (a GGUF model's packed weights included)
        self.threshold = threshold
        # applied inside the worker (runtime.engine.threads); None: what the thread inherits
        self.num_threads = num_threads
        self.sample_rate = sample_rate
        self.max_batch = max_batch  # jobs verified together in one packed reference forward
        self._on_drop = on_drop
        self._queue: queue.Queue[VerifyJob | None] = queue.Queue(maxsize=queue_size)
        self._lock = threading.Condition()
        self.num_submitted = 0  # jobs accepted onto the queue
        self.num_done = 0  # jobs the worker finished (verified or failed)
        self.num_verified = 0  # requests whose probes reached the sink
        self.num_failed = 0  # jobs whose reference run raised (logged)
        self.num_dropped = 0  # jobs refused: queue full or verifier closed
        self.busy_seconds = 0.0  # wall time the worker spent verifying (benchmarks)
        self.cpu_seconds = 0.0  # CPU time of the worker thread itself (benchmarks)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="fastllm-verify", daemon=True)
        if autostart:
            self.start()

    @classmethod
    def from_settings(
        cls, settings: Settings, sink: StatsSink | None = None, *, autostart: bool = True
    ) -> Verifier:
        return cls(
            sink,
            sample_rate=settings.verify_sample_rate,
            queue_size=settings.verify_queue_size,
            autostart=autostart,
            num_threads=settings.num_threads,
            threshold=settings.verify_threshold,
        )

    # --- the engine side: cheap, never blocks, never raises -------------------------------------
    def should_verify(self, request_id: str) -> bool:
        return is_sampled(request_id, self.sample_rate)

    def submit_sequence(self, seq: Sequence, model: nn.Module, dtype: torch.dtype) -> bool:
        """The engine's hook when a request closes (under its lock); False when nothing was
        queued. Never raises: a bug here must not reach the engine loop."""
        try:
            if not seq.is_verified or seq.chosen_logit is None or not seq.output_token_ids:
                return False
            if seq.stats.finished_reason not in _VERIFIED_REASONS:
                return False
            job = VerifyJob(
                request_id=seq.request_id,
                model_name=seq.stats.model,
                version=seq.stats.version,
                model=cast("CausalLM", model),
                dtype=dtype,
                token_ids=(*seq.prompt_token_ids, *seq.output_token_ids[:-1]),
                chosen_token_id=seq.output_token_ids[-1],
                chosen_logit=seq.chosen_logit,
                lora=_adapter_of(seq),
            )
        except Exception:
            log.exception("verify: could not build a job for %s", seq.request_id)
            return False
        return self.submit(job)

    def submit(self, job: VerifyJob) -> bool:
        with self._lock:
            if not self._closed:
                try:
                    self._queue.put_nowait(job)
                    self.num_submitted += 1
                    return True
                except queue.Full:
                    pass
            self.num_dropped += 1
        if self._on_drop is not None:
            try:
                self._on_drop(1)
            except Exception:  # a metrics hook must not break the engine
                log.exception("verify: on_drop hook failed")
        return False

    # --- the worker -----------------------------------------------------------------------------
    def _run(self) -> None:
        if self.num_threads is not None:  # OpenMP's count is per thread
            apply_num_threads(self.num_threads)
        while True:
            if self._queue.empty():  # idle: its OpenMP workers would slow the engine's steps
                release_openmp_workers()
            jobs = self._take()
            if not jobs:
                return
            groups: dict[tuple[int, torch.dtype], list[VerifyJob]] = {}
            for job in jobs:  # engines of different models may share this verifier
                groups.setdefault((id(job.model), job.dtype), []).append(job)
            for group in groups.values():
                self._verify(group)

    def _take(self) -> list[VerifyJob]:
        """The next job (waiting for it) and whatever else is queued, up to max_batch; an
        empty list when the sentinel came first."""
        first = self._queue.get()
        if first is None:
            return []
        jobs = [first]
        while len(jobs) < self.max_batch:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:  # closing: finish this batch, then stop
                self._queue.put_nowait(None)
                break
            jobs.append(job)
        return jobs

    def _verify(self, jobs: list[VerifyJob]) -> None:
        ok = False
        start, cpu_start = time.perf_counter(), time.thread_time()
        try:
            if self.threshold is None:  # the per-model default (see verify_jobs)
                results = verify_jobs(jobs)
            else:
                results = verify_jobs(jobs, self.threshold)
            if self.sink is not None:
                self.sink.record(verified=results)
            ok = True
        except Exception:  # off the hot path: log, count, go on
            log.exception("verify: %d requests could not be verified", len(jobs))
        with self._lock:
            self.busy_seconds += time.perf_counter() - start
            self.cpu_seconds += time.thread_time() - cpu_start
            self.num_done += len(jobs)
            if ok:
                self.num_verified += len(jobs)
            else:
                self.num_failed += len(jobs)
            self._lock.notify_all()

    def start(self) -> None:
        if not self._thread.is_alive() and not self._closed:
            self._thread.start()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every job submitted so far is done; True if it got there in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            target = self.num_submitted
            while self.num_done < target:
                left = None if deadline is None else deadline - time.monotonic()
                if (left is not None and left <= 0) or not self._thread.is_alive():
                    return False
                self._lock.wait(0.05 if left is None else min(left, 0.05))
        return True

    def close(self, timeout: float = 10.0) -> bool:
        """Stop accepting, finish what is queued (up to `timeout`), stop the worker."""
        with self._lock:
            self._closed = True
        done = self.flush(timeout) if self._thread.is_alive() else self._queue.empty()
        num_left = 0
        while True:  # whatever the worker did not get to is dropped (and makes room)
            try:
                num_left += self._queue.get_nowait() is not None
            except queue.Empty:
                break
        if num_left:
            with self._lock:
                self.num_dropped += num_left
        if self._thread.is_alive():
            self._queue.put_nowait(None)  # the sentinel ends the worker's loop
            self._thread.join(timeout=max(1.0, timeout))
        return done

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
