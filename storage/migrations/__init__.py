"""Alembic migrations of the storage schema (a package so they ship inside the wheel)."""
