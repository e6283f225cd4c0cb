"""inference_log.adapter: the LoRA adapter a request was served with

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05

`adapter` is the name the request selected by `model` (runtime.engine.lora); NULL for the base
model, for probe rows, and for rows written before this revision. `model` stays the base model,
so per-model audits and panels keep counting adapted requests under the model that ran them.
Batch mode so SQLite takes the same path as PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("inference_log") as batch:
        batch.add_column(sa.Column("adapter", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("inference_log") as batch:
        batch.drop_column("adapter")
