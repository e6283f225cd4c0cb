"""Retention: delete rows older than `retention_days` from every table, in batches, so a large
backlog never holds one long lock (SQLite) or one huge transaction (PostgreSQL). The alert
evaluator's scheduler runs `prune` periodically; `fastllm db prune` runs it once.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import Engine, delete, select

from storage.models import TABLE_NAMES, Base


def prune(
    engine: Engine,
    retention_days: float,
    batch_size: int = 1000,
    *,
    now: datetime | None = None,
) -> dict[str, int]:
    """Delete rows with ts older than now - retention_days; returns rows deleted per table."""
    if retention_days <= 0:
        raise ValueError("retention_days must be positive")
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    cutoff = (now or datetime.now(timezone.utc)) - timedelta(days=retention_days)
    deleted: dict[str, int] = {}
    for name in TABLE_NAMES:
        table = Base.metadata.tables[name]
        total = 0
        while True:
            # DELETE ... WHERE id IN (SELECT id ... LIMIT n): portable (SQLite and PostgreSQL have
            # no common DELETE ... LIMIT), and each batch is its own short transaction
            victims = select(table.c.id).where(table.c.ts < cutoff).order_by(table.c.id)
            with engine.begin() as conn:
                result = conn.execute(
                    delete(table).where(table.c.id.in_(victims.limit(batch_size).scalar_subquery()))
                )
            total += result.rowcount
            if result.rowcount < batch_size:
                break
        deleted[table.name] = total
    return deleted
