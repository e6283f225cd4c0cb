"""Where alert state transitions are recorded: in memory, or the `alert_events` table."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Protocol

from alerts.state import Transition

if TYPE_CHECKING:
    from storage.store import MetricStore


class EventSink(Protocol):
    def record(self, transitions: Sequence[Transition]) -> None: ...


class MemoryEvents:
    """The last `max_events` transitions (also what `fastllm alerts run` keeps)."""

    def __init__(self, max_events: int = 10_000) -> None:
        self.events: deque[Transition] = deque(maxlen=max_events)
        self._lock = threading.Lock()

    def record(self, transitions: Sequence[Transition]) -> None:
        with self._lock:
            self.events.extend(transitions)

    def snapshot(self) -> list[Transition]:
        with self._lock:
            return list(self.events)


class SqlEvents:
    """Rows of `alert_events` through the storage package's MetricStore."""

    def __init__(self, store: MetricStore) -> None:
        self.store = store

    def record(self, transitions: Sequence[Transition]) -> None:
        from storage.store import AlertRecord

        self.store.add_alert_events(
            [
                AlertRecord(
                    alertname=t.alert.name,
                    state=t.state,
                    ts=datetime.fromtimestamp(t.ts, timezone.utc),
                    labels=t.alert.labels,
                    annotations=t.alert.annotations,
                    value=t.alert.value,
                    fingerprint=t.alert.fingerprint,
                )
                for t in transitions
            ]
        )
