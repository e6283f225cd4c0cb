"""Log a failing background round once per state change, not once per round.

With the database unreachable, every evaluator round failed the same way and logged a full
traceback (one every 15 s, forever). An outage is one WARNING line when it starts (or when the
error changes), DEBUG lines while it lasts (the traceback there, for whoever turns it on), and
one INFO line when it ends with the number of failed rounds.
"""

from __future__ import annotations

import logging


class OutageLog:
    def __init__(self, log: logging.Logger, what: str) -> None:
        self.log, self.what = log, what
        self.num_failed = 0  # rounds failed in a row
        self._last: str | None = None  # the current outage's error, as logged

    @property
    def is_failing(self) -> bool:
        return self.num_failed > 0

    def failed(self, exc: BaseException) -> None:
        self.num_failed += 1
        text = str(exc).strip()
        error = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
        if error != self._last:
            self.log.warning("%s failing: %s (logged again when it changes)", self.what, error)
            self._last = error
        else:
            self.log.debug("%s failed again (%d rounds)", self.what, self.num_failed, exc_info=exc)

    def ok(self) -> None:
        if self.num_failed:
            self.log.info("%s recovered after %d failed rounds", self.what, self.num_failed)
        self.num_failed, self._last = 0, None
