"""The engine: load once, admit requests, run the continuous-batching loop, emit stats.

    engine = Engine(EngineConfig.from_settings(settings), sink=FanOut([...]))
    engine.load()                                   # call-once; any thread; waiters share failures
    handle = engine.submit(GenerationRequest("r1", prompt_ids, SamplingParams(max_tokens=32)))
    for out in handle: ...                          # or `async for`, or handle.result()

Thread-safety: every public method may be called from any thread. `submit` never blocks on the
model once it is loaded (it only takes the bookkeeping lock), so asyncio code may call it
directly; before the load is done use `await engine.asubmit(...)`, which waits in a thread.

Stats the engine hands to the sink itself (the caller must not record these again): every request
that submit() admitted (finished, cancelled, timeout, internal) and every submit() refused with
Overloaded (failure_reason "overloaded"). InvalidRequestError / ServiceUnavailable raised by
submit() are NOT recorded here: the caller records its validation failures.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from runtime.engine.admission import close_features, new_sequence, validate_request
from runtime.engine.batching.controller import (
    AdaptiveBatchController,
    BusyTracker,
    ThroughputUtilization,
)
from runtime.engine.build import EngineParts, build_parts, default_loader
from runtime.engine.config import EngineConfig
from runtime.engine.embed import EmbeddingResult, embed_texts
from runtime.engine.grammar_wait import add_when_compiled
from runtime.engine.introspection import EngineIntrospection
from runtime.engine.load_once import CallOnce
from runtime.engine.lora.wiring import adapter_owner_ids
from runtime.engine.request import GenerationRequest, RequestHandle, ValidatedRequest
from runtime.engine.self_check import IdleSelfCheck
from runtime.engine.sequence import Sequence
from runtime.engine.stats import (
    FailureReason,
    FinishReason,
    RequestEvent,
    RequestStats,
    StatsSink,
)
from runtime.engine.threads import release_openmp_workers
from runtime.errors import InvalidRequestError, Overloaded, ServiceUnavailable
from runtime.memory import Allocator
from runtime.models.loader import LoadedModel
from runtime.models.tokenizer import Tokenizer

if TYPE_CHECKING:
    from runtime.engine.client import SequenceVerifier

__all__ = ["EmbeddingResult", "Engine", "EngineConfig"]


class Engine(EngineIntrospection):
    """Control and introspection (batch policy, figures, LoRA, TP) in introspection.py."""

    def __init__(
        self,
        config: EngineConfig,
        sink: StatsSink | None = None,
        *,
        loader: Callable[[], LoadedModel] | None = None,
        allocator: Allocator | None = None,
        verifier: SequenceVerifier | None = None,
    ) -> None:
        """`allocator`: default the process-wide one of the model's device (tests pass one).
        `verifier`: sampled requests are re-checked on the reference path (runtime.verify); it
        may also be set later (`engine.verifier = ...`); its owner starts and closes it."""
        self.config = config
        self.sink = sink
        self.verifier = verifier
        self.self_check: IdleSelfCheck | None = None  # built with the parts
        self._allocator = allocator
        self._loader = loader or default_loader(config)
        self._once: CallOnce[EngineParts] = CallOnce(self._build)
        # the parts once built: every request reads them without CallOnce's lock
        self._ready: EngineParts | None = None
        self._draining = False
        self._tracker = BusyTracker(window_s=config.control_interval_s)

    # --- loading ---------------------------------------------------------------------------------
    def _build(self) -> EngineParts:
        loaded = self._loader()
        # the same engine-measured signal on every device (NVML is a cross-check in monitoring)
        source = ThroughputUtilization(busy=self._tracker, window_s=self.config.control_interval_s)
        controller = AdaptiveBatchController(self.config.batch_policy, source)
        parts = build_parts(
            self.config, loaded, controller, self._tracker, self.sink, self._allocator
        )
        previous = parts.core.on_close  # the debug leaker, if configured

        def on_close(seq: Sequence) -> None:  # under the core lock: only queues a job
            if previous is not None:
                previous(seq)
            if seq.features is not None:  # a plain sequence has no feature to close
                close_features(seq, seq.features, self.verifier, loaded)

        parts.core.on_close = on_close
        self.self_check = IdleSelfCheck(
            parts.kv_cache,
            parts.allocator,
            label=f"{self.config.model_name}/{self.config.model_version}",
            # live requests, and the resident adapters' blocks (owner lora:<name>) as theirs
            live_ids_of=lambda: [*parts.core.seqs.keys(), *adapter_owner_ids(parts.loras)],
        )
        parts.core.on_idle = self.self_check.on_idle
        # this thread's OpenMP workers (the load, the measurements, the warm-up) go now: the
        # server loads on a worker thread and starts the engine from another, so the start's
        # own release (EngineCore.start) would miss them, and while they live libgomp counts
        # more threads than cores and puts every parallel region of the steps to sleep at its
        # end (measured at 2 threads, 1 stream: 15-33 ms a token served, 11.5-13 without)
        release_openmp_workers()
        self._ready = parts  # complete: CallOnce caches this same object for good
        return parts

    def load(self) -> None:
        self._once.get()

    @property
    def is_loaded(self) -> bool:
        return self._ready is not None

    @property
    def _parts(self) -> EngineParts:
        parts = self._ready
        return parts if parts is not None else self._once.get()

    @property
    def loaded(self) -> LoadedModel:
        return self._parts.loaded

    @property
    def tokenizer(self) -> Tokenizer:
        return self._parts.tokenizer

    def start(self) -> None:
        self._parts.core.start()

    def warm_grammars(self) -> None:
        """Start the grammar compile workers now (otherwise at the first constrained request)."""
        parts = self._ready
        if parts is not None and parts.grammars is not None:
            parts.grammars.warm()

    # --- requests --------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> RequestHandle:
        return self.admit(self.validate(request))

    def validate(self, request: GenerationRequest) -> ValidatedRequest:
        """Every check a request must pass, once (InvalidRequestError naming the parameter).
        The result can be admitted here or, by serving.ReplicaSet, on any replica."""
        if self._draining:
            raise ServiceUnavailable("the engine is shutting down", retry_after_s=5.0)
        # the model loads (once) here if nobody has loaded it yet
        try:
            return validate_request(self.config, self._parts, request)
        except Overloaded:  # its adapter could not be made resident (every slot busy): a
            # refusal like admission's, which the engine records itself (see the module doc)
            if self.sink is not None:
                now = time.time()
                stats = RequestStats(
                    request.request_id,
                    request.model or self.config.model_name,
                    request.version,
                    queued_ts=now,
                    finished_ts=now,
                    failure_reason=FailureReason.OVERLOADED,
                    adapter=request.lora or None,
                )
                self.sink.record(finished=[stats])
            raise

    def admit(self, validated: ValidatedRequest) -> RequestHandle:
        """Queue a validated request (Overloaded when admission control refuses it)."""
        if self._draining:
            raise ServiceUnavailable("the engine is shutting down", retry_after_s=5.0)
        parts = self._parts
        seq = new_sequence(parts, validated, self.verifier, self.cancel)
        request = validated.request
        core = parts.core
        core.start()
        with core.lock:
            if self._draining:
                raise ServiceUnavailable("the engine is shutting down", retry_after_s=5.0)
            if request.request_id in core.seqs:
                raise InvalidRequestError(
                    f"request id {request.request_id!r} is already running", param="request_id"
                )
            refusal = core.scheduler.admission_refusal(seq.num_prompt_tokens, seq.num_seqs)
            if refusal is None:
                seq.mark(RequestEvent.QUEUED, seq.stats.queued_ts)
                if seq.constraint is None:
                    core.add(seq)
                else:  # queued once its grammar is compiled; no step waits for the compile
                    add_when_compiled(core, seq)
                return seq.handle
            retry_after_s = self._retry_after_s(parts)
        seq.stats.failure_reason = FailureReason.OVERLOADED
        seq.stats.finished_ts = time.time()
        if self.sink is not None:
            self.sink.record(finished=[seq.stats])
        raise Overloaded(f"engine overloaded: {refusal}", retry_after_s=retry_after_s)

    async def asubmit(self, request: GenerationRequest) -> RequestHandle:
        """`submit` for asyncio: waits for a model load in a worker thread, not on the loop."""
        if self.is_loaded:
            return self.submit(request)
        return await asyncio.to_thread(self.submit, request)

    def _retry_after_s(self, parts: EngineParts) -> float:
        """How long the queued prompt tokens take at the recent throughput, within [1, 30] s."""
        queued = parts.core.scheduler.num_queued_tokens
        rate = parts.core.tokens_per_s
        return 1.0 if rate <= 0 else min(30.0, max(1.0, queued / rate))

    def cancel(self, request_id: str) -> bool:
        """Cancel a live request: its handle ends with "cancelled" and its KV is freed at once
        (or right after the forward it is part of). False when it is not live."""
        if not self.is_loaded:
            return False
        core = self._parts.core
        with core.lock:
            seq = core.seqs.get(request_id)
            if seq is None:  # choice 0 may have finished while other choices run
                seq = next(
                    (s for s in core.seqs.values() if s.request.request_id == request_id), None
                )
            if seq is None:
                return False
            core.close(seq, finished_reason=FinishReason.CANCELLED)
            core.lock.notify_all()
            return True

    def embed(self, texts: list[str], *, request_id: str | None = None) -> EmbeddingResult:
        if self._draining:
            raise ServiceUnavailable("the engine is shutting down", retry_after_s=5.0)
        parts = self._parts
        return embed_texts(parts, texts, request_id=request_id, sink=self.sink)

    @property
    def is_draining(self) -> bool:
        return self._draining

    def shutdown(self, drain_timeout_s: float = 0.0) -> None:
        """Stop admitting (ServiceUnavailable), let in-flight requests finish within the grace,
        fail what is left with ServiceUnavailable, free its KV and stop the loop thread."""
        self._draining = True
        if not self.is_loaded:
            return
        core = self._parts.core
        deadline = time.monotonic() + drain_timeout_s
        with core.lock:
            while core.seqs and time.monotonic() < deadline:
                core.lock.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            for seq in list(core.seqs.values()):
                error = ServiceUnavailable("the engine shut down before the request finished")
                core.close(seq, error=error, failure_reason=FailureReason.INTERNAL)
        core.stop(timeout_s=max(5.0, drain_timeout_s))
        with core.lock:  # anything closed during the last forward: free its KV now
            for seq in list(core.scheduler.running) + list(core.scheduler.waiting):
                core.scheduler.finish(seq)
            records, core.records = core.records, []
        core.emit(None, records)
        if core.recorder is not None:  # every stat recorded, every final output pushed
            core.recorder.close()
        if self._parts.grammars is not None:
            self._parts.grammars.close()
        if not core.is_running:
            self._parts.kv_cache.close()  # the page pool's memory back to the allocator
            if core.runner.drafter is not None:  # self_draft's own page pool too
                core.runner.drafter.close()
            if self._parts.loras is not None:  # the adapters' blocks too
                self._parts.loras.close()
        if self._parts.loaded.parallel is not None:  # tensor parallel: stop the workers
            self._parts.loaded.parallel.shutdown()
        # the debug leak dies with its engine: the process-wide allocator outlives it (a reload,
        # the next test), and another engine's self-check would count these blocks as its orphans
        for block in self._parts.debug_leaked:
            self._parts.allocator.release(block)
        self._parts.debug_leaked.clear()


if TYPE_CHECKING:  # Engine implements the protocol the layers above are typed with
    from runtime.engine.client import EngineClient

    _conforms: type[EngineClient] = Engine
