"""initial schema: inference_log, metric_samples, alert_events

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from storage.models import UTCDateTime

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "inference_log",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("ts", UTCDateTime(), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("latency_s", sa.Float(), nullable=True),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("batch_size", sa.Integer(), nullable=True),
        sa.Column("op", sa.String(32), nullable=True),
        sa.Column("output", sa.Float(), nullable=True),
        sa.Column("expected", sa.Float(), nullable=True),
    )
    op.create_index("ix_inference_log_ts", "inference_log", ["ts"])
    op.create_index("ix_inference_log_op", "inference_log", ["op"])
    op.create_index("ix_inference_log_request_id", "inference_log", ["request_id"])

    op.create_table(
        "metric_samples",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("ts", UTCDateTime(), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("labels", sa.Text(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
    )
    op.create_index("ix_metric_samples_name_ts", "metric_samples", ["name", "ts"])

    op.create_table(
        "alert_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("ts", UTCDateTime(), nullable=False),
        sa.Column("alertname", sa.String(256), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("labels", sa.Text(), nullable=False),
        sa.Column("annotations", sa.Text(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
    )
    op.create_index("ix_alert_events_alertname_ts", "alert_events", ["alertname", "ts"])


def downgrade() -> None:
    op.drop_index("ix_alert_events_alertname_ts", table_name="alert_events")
    op.drop_table("alert_events")
    op.drop_index("ix_metric_samples_name_ts", table_name="metric_samples")
    op.drop_table("metric_samples")
    op.drop_index("ix_inference_log_request_id", table_name="inference_log")
    op.drop_index("ix_inference_log_op", table_name="inference_log")
    op.drop_index("ix_inference_log_ts", table_name="inference_log")
    op.drop_table("inference_log")
