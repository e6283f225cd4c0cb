"""What comes back across the engine boundary: `TokenOutput` deltas in a `RequestHandle`.

A `RequestHandle` is filled by the engine thread and read by any consumer: a blocking iterator for
threads, an async iterator for asyncio (wake-ups are handed to the consumer's loop with
`call_soon_threadsafe`, so the engine thread never touches a loop directly; one such call per loop
wakes every handle that got output since the last one, so an engine step over 64 sequences costs
one cross-thread wake-up, not 64).
Iteration yields every `TokenOutput`, the last one with `finished_reason` or `error` set, and
never raises; `result()` / `aresult()` join the stream and raise the error, if any.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

from runtime.engine.stats import FinishReason
from runtime.engine.timings import RequestMetrics
from runtime.errors import FastllmError, RequestTimeout

__all__ = ["RequestHandle", "TokenLogprob", "TokenOutput"]


@dataclass(slots=True)  # not frozen: built once per token, a frozen __init__ costs twice as much
class TokenLogprob:
    """One position's log-probability (runtime.engine.logprobs computes them)."""

    token_id: int
    logprob: float
    rank: int  # 1 + how many tokens are strictly more likely (vLLM's rank)
    top: tuple[tuple[int, float], ...] = ()  # the k most likely (id, logprob), best first


@dataclass
class TokenOutput:
    """One delta of a request's stream (or, from `result()`, the whole of it)."""

    request_id: str
    token_ids: list[int]  # tokens produced since the previous output
    text: str  # text delta (never splits a UTF-8 character; stop strings are not included)
    finished_reason: FinishReason | None  # set on the last output of a completed request
    prompt_tokens: int
    completion_tokens: int  # total so far
    error: FastllmError | None = None  # set on the last output of a failed request
    cached_tokens: int = (
        0  # prompt tokens served from the prefix cache (usage.prompt_tokens_details)
    )
    index: int = 0  # which choice (sequence) of the request this output belongs to
    # runtime.engine.logprobs, only when asked: one entry per token of token_ids; the prompt's
    # (None for its first token) on the first output; the sum over all sampled tokens so far
    # (also when best_of > n: the choices are ranked by it)
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    cumulative_logprob: float | None = None
    # on the request's last final output, when it asked (GenerationRequest.report_metrics)
    metrics: RequestMetrics | None = None

    @property
    def is_final(self) -> bool:
        return self.finished_reason is not None or self.error is not None


class RequestHandle:
    def __init__(
        self, request_id: str, cancel: Callable[[str], bool] | None = None, num_choices: int = 1
    ) -> None:
        self.request_id = request_id
        self._cancel = cancel
        # outputs of all choices interleave (`TokenOutput.index`); the stream ends with the last
        # choice's final output, so a consumer stops on a final output only when there is one
        self.num_choices = num_choices
        self._num_final = 0
        self._lock = threading.Condition()
        self._outputs: deque[TokenOutput] = deque()
        self._history: list[TokenOutput] = []  # everything pushed, for result()
        self._done = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    # --- producer side (engine thread) ---------------------------------------------------------
    def push(self, output: TokenOutput) -> None:
        with self._lock:
            if self._done:
                return  # e.g. a cancel raced with the last token: the first final output wins
            self._outputs.append(output)
            self._history.append(output)
            self._num_final += output.is_final
            self._done = self._num_final >= self.num_choices
            self._lock.notify_all()
            waiters = list(self._waiters)
        for loop, event in waiters:
            _waker(loop).wake(event)

    @property
    def finished(self) -> bool:
        with self._lock:
            return self._done

    def cancel(self) -> bool:
        return self._cancel(self.request_id) if self._cancel is not None else False

    # --- consumer side ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[TokenOutput]:
        while True:
            with self._lock:
                while not self._outputs:
                    if self._done:
                        return  # another consumer took the final output
                    self._lock.wait()
                output = self._outputs.popleft()
            yield output
            if output.is_final and self.num_choices == 1:
                return

    async def batches(self) -> AsyncIterator[list[TokenOutput]]:
        """Like `async for`, but each wake-up yields every output already there (the last list
        ends with the final output): a streaming consumer writes once per wake-up, not per token."""
        if type(self).__aiter__ is not RequestHandle.__aiter__:  # a delegating subclass
            async for output in self:
                yield [output]
            return
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            self._waiters.append(entry)
        try:
            while True:
                with self._lock:
                    outputs = list(self._outputs)
                    self._outputs.clear()
                    if not outputs and self._done:
                        return  # another consumer took the final output
                    if not outputs:
                        event.clear()  # cleared under the lock: a push after this sets it again
                if not outputs:
                    await event.wait()
                    continue
                yield outputs
                if outputs[-1].is_final and self.num_choices == 1:
                    return
        finally:
            with self._lock:
                self._waiters.remove(entry)

    async def __aiter__(self) -> AsyncIterator[TokenOutput]:
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            self._waiters.append(entry)
        try:
            while True:
                with self._lock:
                    output = self._outputs.popleft() if self._outputs else None
                    if output is None and self._done:
                        return  # another consumer took the final output
                    if output is None:
                        event.clear()  # cleared under the lock: a push after this sets it again
                if output is None:
                    await event.wait()
                    continue
                yield output
                if output.is_final and self.num_choices == 1:
                    return
        finally:
            with self._lock:
                self._waiters.remove(entry)

    def result(self, timeout: float | None = None) -> TokenOutput:
        """Block until finished; the whole completion as one output. Raises the request's error."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._done, timeout):
                raise RequestTimeout(f"request {self.request_id} not finished after {timeout}s")
            return _join(self.request_id, self._history)

    async def aresult(self) -> TokenOutput:
        async for _ in self:
            pass
        with self._lock:
            return _join(self.request_id, self._history)


class _LoopWaker:
    """Sets asyncio events on one loop from other threads with one `call_soon_threadsafe` per
    batch: wakes that arrive before the loop ran the last one ride along with it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: list[asyncio.Event] = []

    def wake(self, event: asyncio.Event) -> None:
        with self._lock:
            self._pending.append(event)
            if len(self._pending) > 1:
                return  # a wake-up is already on its way
        try:
            self._loop.call_soon_threadsafe(self._fire)
        except RuntimeError:  # a closed loop: nobody is listening
            with self._lock:
                self._pending.clear()

    def _fire(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for event in pending:
            event.set()


_wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaker] = (
    weakref.WeakKeyDictionary()
)
_wakers_lock = threading.Lock()


def _waker(loop: asyncio.AbstractEventLoop) -> _LoopWaker:
    with _wakers_lock:
        waker = _wakers.get(loop)
        if waker is None:
            waker = _wakers[loop] = _LoopWaker(loop)
        return waker


def _join(request_id: str, outputs: list[TokenOutput]) -> TokenOutput:
    last = outputs[-1]
    if last.error is not None:
        raise last.error
    return TokenOutput(
        request_id=request_id,
        token_ids=[t for o in outputs for t in o.token_ids],
        text="".join(o.text for o in outputs),
        finished_reason=last.finished_reason,
        prompt_tokens=last.prompt_tokens,
        completion_tokens=last.completion_tokens,
        cached_tokens=last.cached_tokens,
        logprobs=_joined_logprobs(outputs),
        prompt_logprobs=next(
            (o.prompt_logprobs for o in outputs if o.prompt_logprobs is not None), None
        ),
        cumulative_logprob=last.cumulative_logprob,
        metrics=last.metrics,
    )


def _joined_logprobs(outputs: list[TokenOutput]) -> list[TokenLogprob] | None:
    if all(o.logprobs is None for o in outputs):
        return None
    return [entry for o in outputs for entry in o.logprobs or ()]
