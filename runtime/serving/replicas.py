"""Several Engine replicas behind one Engine-like surface, fed by a work-stealing pool.

    replicas = ReplicaSet.from_settings(settings, sink)      # settings.num_replicas engines
    handle = replicas.submit(request)                         # same contract as Engine.submit

Dispatch (pull mode, DESIGN.md "Work-stealing pool"): `submit` validates the request on replica 0
(so an invalid request still raises at once), then puts it on the set's `StealingQueues` (one
deque per replica, least loaded first; `replica=` pins it, for tests) and returns a
`ReplicaHandle` at once. Each replica has a feeder thread that takes work only while its engine has
room (fewer than `max_waiting` requests waiting, and fewer than `max_inflight` in the engine when
set): its own deque first, else it steals from the longest one; aging bounds how far a request is
overtaken. The feeder hands the request to its engine and binds the engine's handle to the
caller's. A cancel before that ends the handle itself; after it, it cancels on the engine.

Stats: replicas record admitted requests as an Engine does; the set records what never reached a
replica (its own Overloaded refusals, cancels while queued, requests failed at shutdown).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from runtime.engine.engine import EmbeddingResult, Engine, EngineConfig
from runtime.engine.request import (
    GenerationRequest,
    RequestHandle,
    ValidatedRequest,
)
from runtime.engine.stats import (
    FailureReason,
    FinishReason,
    RequestStats,
    StatsSink,
)
from runtime.errors import (
    ConfigError,
    FastllmError,
    InvalidRequestError,
    Overloaded,
    ServiceUnavailable,
)
from runtime.models.loader import LoadedModel
from runtime.models.tokenizer import Tokenizer
from runtime.serving.replica_handle import QueuedRequest, ReplicaHandle, unreached_output
from runtime.serving.replica_introspection import ReplicaIntrospection
from runtime.serving.work_queues import PoolConfig, StealingQueues

__all__ = ["ReplicaSet"]

POLL_S = 0.005  # how often a feeder whose engine is full looks again (engines do not notify)


class ReplicaSet(ReplicaIntrospection):
    """Control and figures (batch policy, stats, reports) in replica_introspection.py."""

    def __init__(
        self,
        replicas: Sequence[Engine],
        *,
        sink: StatsSink | None = None,
        max_queued: int = 256,
        max_overtakes: int | None = 32,
        max_waiting: int = 2,
        max_inflight: int | None = None,
    ) -> None:
        if not replicas:
            raise ConfigError("a replica set needs at least one engine", param="num_replicas")
        self.replicas = list(replicas)
        self.sink = sink
        self.max_waiting = max_waiting
        self.max_inflight = max_inflight
        config = PoolConfig(
            num_workers=len(self.replicas),
            max_overtakes=max_overtakes,
            max_queued=max_queued,
            record_limit=256,
        )
        self.queues: StealingQueues[QueuedRequest] = StealingQueues(config)
        self._lock = threading.Lock()
        # submitted, not yet bound to an engine's handle
        self._queued: dict[str, QueuedRequest] = {}
        self._feeders: list[threading.Thread] = []
        self._abort = threading.Event()
        self._draining = False
        self._rr = 0  # round robin for embed()

    @classmethod
    def from_settings(cls, settings: Any, sink: StatsSink | None = None) -> ReplicaSet:
        """`settings.num_replicas` engines; on several GPUs each gets its own (cuda:i)."""
        devices = replica_devices(settings.device, settings.num_replicas)
        engines = [
            Engine(EngineConfig.from_settings(settings, device=device), sink=sink)
            for device in devices
        ]
        return cls(engines, sink=sink, max_queued=settings.max_queued_requests)

    # --- loading and lifecycle -------------------------------------------------------------------
    def load(self) -> None:
        for engine in self.replicas:
            engine.load()

    @property
    def is_loaded(self) -> bool:
        return all(engine.is_loaded for engine in self.replicas)

    @property
    def loaded(self) -> LoadedModel:
        return self.replicas[0].loaded

    @property
    def tokenizer(self) -> Tokenizer:
        return self.replicas[0].tokenizer

    def start(self) -> None:
        for engine in self.replicas:
            engine.start()
        self._start_feeders()

    def warm_grammars(self) -> None:
        for engine in self.replicas:
            engine.warm_grammars()

    def _start_feeders(self) -> None:
        with self._lock:
            if self._feeders:
                return
            for i in range(len(self.replicas)):
                t = threading.Thread(
                    target=self._feed, args=(i,), name=f"fastllm-replica-{i}", daemon=True
                )
                self._feeders.append(t)
                t.start()

    @property
    def is_draining(self) -> bool:
        return self._draining

    # --- requests --------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest, replica: int | None = None) -> RequestHandle:
        if self._draining:
            raise ServiceUnavailable("the engine is shutting down", retry_after_s=5.0)
        validated = self._validate(request)
        stats = validated.stats
        handle = ReplicaHandle(request.request_id, self.cancel)
        item = QueuedRequest(validated, handle)
        refusal: Overloaded | None = None
        with self._lock:
            if request.request_id in self._queued:
                raise InvalidRequestError(
                    f"request id {request.request_id!r} is already queued", param="request_id"
                )
            try:
                self.queues.put(item, replica)
            except Overloaded as exc:
                refusal = exc
            else:
                self._queued[request.request_id] = item
        if refusal is not None:
            self._record(stats, failure_reason=FailureReason.OVERLOADED)
            raise refusal
        self._start_feeders()
        return handle

    async def asubmit(self, request: GenerationRequest) -> RequestHandle:
        if self.replicas[0].is_loaded:
            return self.submit(request)
        return await asyncio.to_thread(self.submit, request)

    def _validate(self, request: GenerationRequest) -> ValidatedRequest:
        """The engines' own checks, here so an invalid request fails at once (not in the
        stream); the validated request is what a replica later admits."""
        return self.replicas[0].validate(request)

    def cancel(self, request_id: str) -> bool:
        with self._lock:
            item = self._queued.get(request_id)
        if item is not None:
            final = unreached_output(item, finished_reason=FinishReason.CANCELLED)
            if item.handle.end_unbound(final):
                self._record(item.stats, finished_reason=FinishReason.CANCELLED)
                return True
            inner = item.handle.inner
            if inner is None:
                return False  # it had already ended
        return any(engine.cancel(request_id) for engine in self.replicas)

    # --- feeders ---------------------------------------------------------------------------------
    def _has_room(self, engine: Engine) -> bool:
        waiting = engine.num_waiting
        if waiting >= self.max_waiting:
            return False
        return self.max_inflight is None or waiting + engine.num_running < self.max_inflight

    def _feed(self, index: int) -> None:
        engine = self.replicas[index]
        while not self._abort.is_set():
            if not self._has_room(engine):
                self._abort.wait(POLL_S)
                continue
            taken = self.queues.take(index, block=True, timeout=0.1)
            if taken is None:
                if self._draining and not len(self.queues):
                    return  # closed and drained
                continue
            try:
                self._dispatch(engine, taken.task)
            finally:
                self.queues.done(index)

    def _dispatch(self, engine: Engine, item: QueuedRequest) -> None:
        rid = item.request.request_id
        try:
            if item.handle.finished:
                return  # cancelled while queued
            try:
                inner = engine.admit(item.validated)
            except FastllmError as exc:  # e.g. the replica shut down: end the caller's stream
                is_ended = item.handle.end_unbound(unreached_output(item, error=exc))
                if is_ended and not isinstance(exc, Overloaded):  # the engine records those
                    self._record(item.stats, failure_reason=FailureReason.INTERNAL)
                return
            if not item.handle.bind(inner):  # cancelled between submit and bind
                engine.cancel(rid)
        finally:
            with self._lock:
                self._queued.pop(rid, None)

    def embed(self, texts: list[str], *, request_id: str | None = None) -> EmbeddingResult:
        if self._draining:
            raise ServiceUnavailable("the engine is shutting down", retry_after_s=5.0)
        with self._lock:
            engine = self.replicas[self._rr % len(self.replicas)]
            self._rr += 1
        return engine.embed(texts, request_id=request_id)

    def shutdown(self, drain_timeout_s: float = 0.0) -> None:
        """Stop admitting; queued requests get the grace to reach a replica (the rest fail with
        ServiceUnavailable), then every replica drains within what is left of it, in parallel."""
        self._draining = True
        deadline = time.monotonic() + drain_timeout_s
        self.queues.close(drain=True)
        for t in self._feeders:
            t.join(max(0.0, deadline - time.monotonic()))
        left = self.queues.close(drain=False)
        self._abort.set()
        for t in self._feeders:
            t.join()  # a feeder is at most one engine.submit (no model call) from exiting
        error = ServiceUnavailable("the engine shut down before the request was scheduled")
        for item in left:
            if item.handle.end_unbound(unreached_output(item, error=error)):
                self._record(item.stats, failure_reason=FailureReason.INTERNAL)
        remaining = max(0.0, deadline - time.monotonic())
        stoppers = [
            threading.Thread(target=engine.shutdown, args=(remaining,), daemon=True)
            for engine in self.replicas
        ]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()

    def _record(
        self,
        stats: RequestStats,
        *,
        finished_reason: FinishReason | None = None,
        failure_reason: FailureReason | None = None,
    ) -> None:
        stats.finished_reason = finished_reason
        stats.failure_reason = failure_reason
        stats.finished_ts = time.time()
        if self.sink is not None:
            self.sink.record(finished=[stats])


def replica_devices(device: str, num_replicas: int) -> list[str]:
    """Spread replicas over the GPUs (cuda:0, cuda:1, ...) when `device` asks for CUDA without an
    index and there are several; otherwise every replica shares `device` (CPU replicas)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device in ("auto", "cuda") and count > 1:
        return [f"cuda:{i % count}" for i in range(num_replicas)]
    return [device] * num_replicas


if TYPE_CHECKING:  # ReplicaSet implements the protocol the layers above are typed with
    from runtime.engine.client import EngineClient

    _conforms: type[EngineClient] = ReplicaSet
