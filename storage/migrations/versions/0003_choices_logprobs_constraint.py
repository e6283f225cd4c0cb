"""inference_log.n, .logprobs, .constraint: what the request asked for beyond one plain completion

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02

`n` is the number of choices, `logprobs` whether log-probabilities were asked (sampled or prompt),
`constraint` the structured-output kind (none, json, regex, choice, grammar, tools). Nullable:
rows written before this revision (and probe rows) have no value. Batch mode so SQLite (no ALTER
COLUMN) takes the same path as PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("inference_log") as batch:
        batch.add_column(sa.Column("n", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("logprobs", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("constraint", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("inference_log") as batch:
        batch.drop_column("constraint")
        batch.drop_column("logprobs")
        batch.drop_column("n")
