"""The call-once contract for model loading.

However many threads call `get()` at the same time, the function runs once: the first caller runs
it, the others wait on that attempt. A failure is reported to that caller and to every waiter of
the same attempt (each gets its own exception, chained to the cause) and is not cached: the next
call starts a new attempt. A success is cached for good.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from runtime.errors import ModelLoadError

T = TypeVar("T")


class _Attempt(Generic[T]):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None


class CallOnce(Generic[T]):
    def __init__(self, fn: Callable[[], T], *, what: str = "model load") -> None:
        self._fn = fn
        self._what = what
        self._lock = threading.Lock()  # guards the two fields below; never held while fn runs
        self._value: T | None = None
        self._is_done = False
        self._attempt: _Attempt[T] | None = None
        self.num_calls = 0  # times fn ran (successful or not)

    @property
    def is_done(self) -> bool:
        return self._is_done

    def get(self) -> T:
        with self._lock:
            if self._is_done:
                return self._value  # type: ignore[return-value]
            attempt = self._attempt
            is_leader = attempt is None
            if attempt is None:
                attempt = self._attempt = _Attempt()
                self.num_calls += 1
        if is_leader:
            self._run(attempt)
        else:
            attempt.done.wait()
        if attempt.error is not None:
            raise _as_load_error(self._what, attempt.error) from attempt.error
        return attempt.value  # type: ignore[return-value]

    def _run(self, attempt: _Attempt[T]) -> None:
        try:
            attempt.value = self._fn()
        except BaseException as exc:
            attempt.error = exc
        with self._lock:
            if attempt.error is None:
                self._value, self._is_done = attempt.value, True
            self._attempt = None  # a failed attempt is not cached: the next call retries
        attempt.done.set()


def _as_load_error(what: str, cause: BaseException) -> ModelLoadError:
    """A fresh exception per waiter (one object raised in many threads would share a traceback)."""
    if isinstance(cause, ModelLoadError):
        return type(cause)(cause.message, param=cause.param, code=cause.code)
    return ModelLoadError(f"{what} failed: {type(cause).__name__}: {cause}")
