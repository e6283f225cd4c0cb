"""The handle a `ReplicaSet` returns before any replica has the request (runtime.serving.replicas).

While the request waits in the set's deques the handle is *unbound*: a cancel or a shutdown ends
it with its own final output. Once a replica's engine accepted the request the feeder `bind`s the
engine's handle, and every consumer call delegates to it from then on, so tokens flow straight
from the engine thread to the consumer (no forwarding thread). `bind` after the handle ended
returns False and the feeder cancels the engine's copy.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

from runtime.engine.request import (
    GenerationRequest,
    RequestHandle,
    TokenOutput,
    ValidatedRequest,
)
from runtime.engine.stats import FinishReason, RequestStats
from runtime.errors import FastllmError

__all__ = ["QueuedRequest", "ReplicaHandle", "unreached_output"]


class ReplicaHandle(RequestHandle):
    def __init__(self, request_id: str, cancel: Callable[[str], bool] | None = None) -> None:
        super().__init__(request_id, cancel)
        self._inner: RequestHandle | None = None

    # --- set side --------------------------------------------------------------------------------
    def bind(self, inner: RequestHandle) -> bool:
        """Delegate to the engine's handle; False when this handle already ended (cancelled)."""
        with self._lock:
            if self._done:
                return False
            self._inner = inner
            self._lock.notify_all()
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening
                loop.call_soon_threadsafe(event.set)
        return True

    def end_unbound(self, output: TokenOutput) -> bool:
        """End the handle with `output` (final) unless an engine has it; True when it did."""
        with self._lock:  # an RLock (Condition's default): push takes it again
            if self._inner is not None or self._done:
                return False
            self.push(output)
            return True

    @property
    def inner(self) -> RequestHandle | None:
        with self._lock:
            return self._inner

    def _ready(self) -> bool:
        return self._inner is not None or self._done

    # --- consumer side ---------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        inner = self.inner
        return inner.finished if inner is not None else super().finished

    def __iter__(self) -> Iterator[TokenOutput]:
        with self._lock:
            self._lock.wait_for(self._ready)
            inner = self._inner
        yield from (inner if inner is not None else super().__iter__())

    async def _await_ready(self) -> None:
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            if self._ready():
                return
            self._waiters.append(entry)
        try:
            while True:
                with self._lock:
                    if self._ready():
                        return
                    event.clear()  # under the lock: a bind/push after this sets it again
                await event.wait()
        finally:
            with self._lock:
                self._waiters.remove(entry)

    async def __aiter__(self) -> AsyncIterator[TokenOutput]:
        await self._await_ready()
        inner = self.inner
        source = inner.__aiter__() if inner is not None else super().__aiter__()
        async for output in source:
            yield output

    async def batches(self) -> AsyncIterator[list[TokenOutput]]:
        """The engine handle's batched stream once bound (one write per wake-up)."""
        await self._await_ready()
        inner = self.inner
        if inner is None:  # ended while queued: one final output
            async for output in super().__aiter__():
                yield [output]
            return
        async for outputs in inner.batches():
            yield outputs

    def result(self, timeout: float | None = None) -> TokenOutput:
        with self._lock:
            self._lock.wait_for(self._ready, timeout)
            inner = self._inner
        # unbound and not done after the timeout: the base class raises RequestTimeout at once
        return inner.result(timeout) if inner is not None else super().result(0.0)

    async def aresult(self) -> TokenOutput:
        await self._await_ready()
        inner = self.inner
        return await (inner.aresult() if inner is not None else super().aresult())


@dataclass
class QueuedRequest:
    """A request on the set's deques: what a replica admits, and the handle its caller holds."""

    validated: ValidatedRequest  # what the replica that takes it admits
    handle: ReplicaHandle

    @property
    def request(self) -> GenerationRequest:
        return self.validated.request

    @property
    def stats(self) -> RequestStats:  # recorded here only if no replica ever gets the request
        return self.validated.stats


def unreached_output(
    item: QueuedRequest,
    *,
    finished_reason: FinishReason | None = None,
    error: FastllmError | None = None,
) -> TokenOutput:
    """The final output of a request no replica admitted (cancelled while queued, refused by
    its replica, failed at shutdown)."""
    return TokenOutput(
        request_id=item.request.request_id,
        token_ids=[],
        text="",
        finished_reason=finished_reason,
        prompt_tokens=item.stats.prompt_tokens,
        completion_tokens=0,
        error=error,
    )
