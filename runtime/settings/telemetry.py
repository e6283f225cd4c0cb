"""Settings of what watches the engine: metrics and tracing, the inference log and its
retention, verification sampling, the alert evaluator."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


class TelemetrySettings(BaseModel):
    # --- monitoring ----------------------------------------------------------------------------
    latency_buckets_s: list[float] = Field(
        default_factory=lambda: [
            0.001,
            0.005,
            0.01,
            0.02,
            0.04,
            0.06,
            0.08,
            0.1,
            0.25,
            0.5,
            0.75,
            1.0,
            2.5,
            5.0,
            7.5,
            10.0,
            20.0,
            40.0,
            80.0,
        ]
    )
    memory_sample_interval_s: float = Field(5.0, gt=0)
    otel_service_name: str = "fastllm"
    trace_sample_ratio: float = Field(1.0, ge=0.0, le=1.0)

    # --- storage / verification ------------------------------------------------------------------
    database_url: str = "sqlite:///var/fastllm.db"
    log_queue_size: int = Field(10000, ge=1)
    log_batch_size: int = Field(256, ge=1)
    # rows still queued when a shutdown's flush (log_close_timeout_s) ran out are kept here and
    # written at the next start; default: beside the SQLite file, or var/ for PostgreSQL
    log_spool_path: Path | None = None
    log_close_timeout_s: float = Field(10.0, ge=0.0)
    retention_days: float = Field(30.0, gt=0)
    verify_sample_rate: float = Field(0.01, ge=0.0, le=1.0)
    verify_queue_size: int = Field(256, ge=1, description="verification jobs waiting; full: drop")
    verify_threshold: float | None = Field(None, description="override per-dtype default")

    # --- alerts ------------------------------------------------------------------------------
    alerts_enabled: bool = True
    # the evaluator's sampling + evaluation period; the status page reads its samples, so its stat
    # panels lag a request by at most this (15 s read 0 requests for 15 s after they were served)
    alerts_interval_s: float = Field(5.0, gt=0)
    alerts_rules_path: Path | None = None
    alerts_webhook_url: str | None = None
    alertmanager_url: str | None = None
    # multiply every rule's `for:` and range windows by this (tests/demos shorten them)
    alerts_time_scale: float = Field(1.0, gt=0)
    debug_leak_blocks_per_request: int = Field(0, ge=0, description="debug: leak blocks on purpose")
