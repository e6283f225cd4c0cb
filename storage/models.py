"""The SQL schema: `inference_log` (the audit table), `metric_samples` (series the embedded alert
evaluator reads) and `alert_events` (its state transitions). Changes go through a migration in
storage/migrations/versions; tests/storage/test_migrations.py checks both stay in sync.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Boolean, DateTime, Dialect, Float, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on both sides. PostgreSQL stores `timestamptz`; SQLite has no zone, so
    values are stored as naive UTC (string order = time order) and get tzinfo=UTC back on read."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: pass a timezone-aware (UTC) timestamp")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    pass


class InferenceLog(Base):
    """One row per request (status = finished or failure reason); a verified request's row also
    carries op="logit" with output/expected, and each further per-op probe of that request is an
    extra row with status="probe" and the same request_id."""

    __tablename__ = "inference_log"
    __table_args__ = (
        Index("ix_inference_log_ts", "ts"),
        Index("ix_inference_log_op", "op"),
        Index("ix_inference_log_request_id", "request_id"),
        Index("ix_inference_log_instance", "instance"),  # migration 0004
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    request_id: Mapped[str] = mapped_column(String(128), nullable=False)
    model: Mapped[str] = mapped_column(String(256), nullable=False, default="")
    version: Mapped[str] = mapped_column(String(64), nullable=False, default="")
    # stop | length | cancelled | validation | overloaded | internal | timeout | probe
    status: Mapped[str] = mapped_column(String(32), nullable=False)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    # of prompt_tokens, those whose KV came from the prefix cache (migration 0002)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    # what the request asked for (migration 0003): choices, whether logprobs were asked, and the
    # structured-output kind (none | json | regex | choice | grammar | tools)
    n: Mapped[int | None] = mapped_column(Integer)
    logprobs: Mapped[bool | None] = mapped_column(Boolean)
    constraint: Mapped[str | None] = mapped_column(String(16))
    latency_s: Mapped[float | None] = mapped_column(Float)
    ttft_s: Mapped[float | None] = mapped_column(Float)
    batch_size: Mapped[int | None] = mapped_column(Integer)
    # verification: the probe name and both scalars; NULL when the request was not verified
    op: Mapped[str | None] = mapped_column(String(32))
    output: Mapped[float | None] = mapped_column(Float)
    expected: Mapped[float | None] = mapped_column(Float)
    # (migration 0004) the bound |output - expected| was checked against when it was recorded
    # (runtime.verify.tolerance; NULL: not verified, or written before 0004), and the server
    # that wrote the row (host:port), so one database can hold several servers' rows
    tolerance: Mapped[float | None] = mapped_column(Float)
    instance: Mapped[str | None] = mapped_column(String(256))
    # (migration 0007) speculative decoding: tokens drafted for the request and accepted by the
    # model (acceptance = accepted / drafted); NULL when nothing was drafted for it
    spec_draft_tokens: Mapped[int | None] = mapped_column(Integer)
    spec_accepted_tokens: Mapped[int | None] = mapped_column(Integer)
    # (migration 0006) the LoRA adapter the request selected by `model`; NULL: the base model
    adapter: Mapped[str | None] = mapped_column(String(128))


class MetricSample(Base):
    """One sample of one series; `labels` is canonical JSON (sorted keys) so equal label sets
    compare equal as text."""

    __tablename__ = "metric_samples"
    __table_args__ = (Index("ix_metric_samples_name_ts", "name", "ts"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    name: Mapped[str] = mapped_column(String(256), nullable=False)
    labels: Mapped[str] = mapped_column(Text, nullable=False, default="{}")
    value: Mapped[float] = mapped_column(Float, nullable=False)


class AlertEvent(Base):
    """One state transition of one alert instance (identified by `fingerprint`)."""

    __tablename__ = "alert_events"
    __table_args__ = (Index("ix_alert_events_alertname_ts", "alertname", "ts"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    alertname: Mapped[str] = mapped_column(String(256), nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)  # pending | firing | resolved
    labels: Mapped[str] = mapped_column(Text, nullable=False, default="{}")
    annotations: Mapped[str] = mapped_column(Text, nullable=False, default="{}")
    value: Mapped[float | None] = mapped_column(Float)
    fingerprint: Mapped[str] = mapped_column(String(64), nullable=False)


class StoredResponse(Base):
    """A /v1/responses response kept with `store: true` (migration 0004): its final object and
    the conversation it ends (chat turns, JSON), so `previous_response_id` continues it on any
    replica sharing the database. `tenant` is the API key's tenant (`key-<n>`, "" without keys):
    only the same tenant reads or deletes it. Retention prunes it by `ts` like every table."""

    __tablename__ = "stored_responses"
    __table_args__ = (
        Index("ix_stored_responses_response_id", "response_id", unique=True),
        Index("ix_stored_responses_ts", "ts"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    response_id: Mapped[str] = mapped_column(String(128), nullable=False)
    tenant: Mapped[str] = mapped_column(String(64), nullable=False, default="")
    model: Mapped[str] = mapped_column(String(256), nullable=False, default="")
    response: Mapped[str] = mapped_column(Text, nullable=False)  # the response object, JSON
    turns: Mapped[str] = mapped_column(Text, nullable=False)  # the conversation's turns, JSON


TABLE_NAMES = ("inference_log", "metric_samples", "alert_events", "stored_responses")
