"""inference_log.spec_draft_tokens, .spec_accepted_tokens: speculative decoding per request

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05

The tokens drafted for a request (n-gram or self-draft, every choice) and how many of them the
model accepted; the request's acceptance is their ratio. Nullable: NULL for a request nothing was
drafted for (speculation off, opted out, or never drafting) and for rows written before this
revision. Batch mode so SQLite takes the same path as PostgreSQL.

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("inference_log") as batch:
        batch.add_column(sa.Column("spec_draft_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("spec_accepted_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("inference_log") as batch:
        batch.drop_column("spec_accepted_tokens")
        batch.drop_column("spec_draft_tokens")
