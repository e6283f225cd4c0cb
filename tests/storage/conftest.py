"""Every storage test runs twice: on a SQLite file and on a throwaway PostgreSQL database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from storage.db import make_engine, upgrade


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'nested' / 'fastllm.db'}"  # parent dir does not exist yet
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """A migrated database of its own."""
    eng = make_engine(db_url)
    upgrade(eng)
    yield eng
    eng.dispose()
