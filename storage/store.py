"""Synchronous store for the embedded alert evaluator: metric samples in, series out; alert
state transitions in and out. Labels are stored as canonical JSON (sorted keys, no spaces), so an
exact label-set match is a plain string comparison in SQL on both databases.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Engine, insert, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from storage.db import make_engine
from storage.errors import StorageError
from storage.models import AlertEvent, MetricSample


def canonical_labels(labels: Mapping[str, str]) -> str:
    return json.dumps(dict(labels), sort_keys=True, separators=(",", ":"))


def fingerprint(alertname: str, labels: Mapping[str, str]) -> str:
    """Stable id of one alert instance (name + label set)."""
    return hashlib.sha256(f"{alertname}\x00{canonical_labels(labels)}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Sample:
    name: str
    value: float
    ts: datetime  # timezone-aware
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AlertRecord:
    alertname: str
    state: str  # "pending" | "firing" | "resolved"
    ts: datetime  # timezone-aware
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    value: float | None = None
    fingerprint: str = ""  # computed from alertname + labels when empty


class MetricStore:
    def __init__(self, engine: Engine | str) -> None:
        self.engine = make_engine(engine) if isinstance(engine, str) else engine

    @contextmanager
    def _session(self) -> Iterator[Session]:
        try:
            with Session(self.engine) as session, session.begin():
                yield session
        except SQLAlchemyError as exc:
            raise StorageError(f"database error: {exc}") from exc

    def add_samples(self, samples: Sequence[Sample]) -> None:
        if not samples:
            return
        # NaN (e.g. utilization before the step-time model has a fit) has no SQL value: such a
        # sample is left out, so the series reads as absent there, never as a failed round
        rows = [
            {"ts": s.ts, "name": s.name, "labels": canonical_labels(s.labels), "value": s.value}
            for s in samples
            if not math.isnan(s.value)
        ]
        if not rows:
            return
        with self._session() as session:
            session.execute(insert(MetricSample), rows)

    def samples(
        self,
        name: str,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[Sample]:
        """Samples of `name` in [since, until], oldest first; `labels` = exact label set."""
        query = select(MetricSample).where(MetricSample.name == name)
        if since is not None:
            query = query.where(MetricSample.ts >= since)
        if until is not None:
            query = query.where(MetricSample.ts <= until)
        if labels is not None:
            query = query.where(MetricSample.labels == canonical_labels(labels))
        with self._session() as session:
            found = session.scalars(query.order_by(MetricSample.ts, MetricSample.id)).all()
            return [Sample(m.name, m.value, m.ts, json.loads(m.labels)) for m in found]

    def add_alert_events(self, events: Sequence[AlertRecord]) -> None:
        if not events:
            return
        rows = [
            {
                "ts": e.ts,
                "alertname": e.alertname,
                "state": e.state,
                "labels": canonical_labels(e.labels),
                "annotations": canonical_labels(e.annotations),
                "value": e.value,
                "fingerprint": e.fingerprint or fingerprint(e.alertname, e.labels),
            }
            for e in events
        ]
        with self._session() as session:
            session.execute(insert(AlertEvent), rows)

    def alert_events(
        self,
        *,
        alertname: str | None = None,
        state: str | None = None,
        since: datetime | None = None,
    ) -> list[AlertRecord]:
        """Alert state transitions, oldest first."""
        query = select(AlertEvent)
        if alertname is not None:
            query = query.where(AlertEvent.alertname == alertname)
        if state is not None:
            query = query.where(AlertEvent.state == state)
        if since is not None:
            query = query.where(AlertEvent.ts >= since)
        with self._session() as session:
            found = session.scalars(query.order_by(AlertEvent.ts, AlertEvent.id)).all()
            return [
                AlertRecord(
                    alertname=a.alertname,
                    state=a.state,
                    ts=a.ts,
                    labels=json.loads(a.labels),
                    annotations=json.loads(a.annotations),
                    value=a.value,
                    fingerprint=a.fingerprint,
                )
                for a in found
            ]
