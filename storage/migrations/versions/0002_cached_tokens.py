"""inference_log.cached_tokens: prompt tokens whose KV came from the prefix cache

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

Nullable: rows written before this revision (and probe rows) have no value; batch mode so
SQLite (no ALTER COLUMN) takes the same path as PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("inference_log") as batch:
        batch.add_column(sa.Column("cached_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("inference_log") as batch:
        batch.drop_column("cached_tokens")
