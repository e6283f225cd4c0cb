"""stored_responses: /v1/responses kept with `store: true`

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05

One row per stored response: its final object and the conversation it ends (JSON text), the API
key's tenant that may read it, and `ts` for retention (storage.retention prunes every table).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from storage.models import UTCDateTime

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "stored_responses",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("ts", UTCDateTime(), nullable=False),
        sa.Column("response_id", sa.String(128), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("turns", sa.Text(), nullable=False),
    )
    op.create_index(
        "ix_stored_responses_response_id", "stored_responses", ["response_id"], unique=True
    )
    op.create_index("ix_stored_responses_ts", "stored_responses", ["ts"])


def downgrade() -> None:
    op.drop_index("ix_stored_responses_ts", table_name="stored_responses")
    op.drop_index("ix_stored_responses_response_id", table_name="stored_responses")
    op.drop_table("stored_responses")
