"""inference_log.tolerance, .instance: the bound a verified row was checked against, and the
server that wrote the row

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05

`tolerance` is the bound |output - expected| was checked against when the row was recorded
(runtime.verify.tolerance: it grows with the logit's magnitude and the dtype's spacing there),
so an audit counts each row against its own bound. `instance` is the writing server's
host:port: servers sharing one database (the default SQLite file) audit only their own rows.
Nullable: rows written before this revision have neither; an index on `instance` because the
status page filters by it on every refresh. Batch mode so SQLite takes the same path as
PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("inference_log") as batch:
        batch.add_column(sa.Column("tolerance", sa.Float(), nullable=True))
        batch.add_column(sa.Column("instance", sa.String(256), nullable=True))
        batch.create_index("ix_inference_log_instance", ["instance"])


def downgrade() -> None:
    with op.batch_alter_table("inference_log") as batch:
        batch.drop_index("ix_inference_log_instance")
        batch.drop_column("instance")
        batch.drop_column("tolerance")
