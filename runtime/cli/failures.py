"""The one line a CLI or startup failure ends in, for errors that are not FastllmErrors.

Typed errors (runtime.errors) already carry their message; these are the environment's own
exceptions that used to escape as tracebacks: a file that cannot be opened or written
(`convert --output /proc/1/nope`), malformed YAML, an unknown Alembic revision, an unreachable
or broken database, a number too large to represent. Each becomes `error: <what>: <why>` on
stderr and exit 2; FASTLLM_DEBUG=1 re-raises for the traceback.
"""

from __future__ import annotations

import os


def describe(exc: BaseException) -> str | None:
    """One line naming the file or setting, or None for an exception this does not know."""
    if isinstance(exc, OSError):
        where = exc.filename if exc.filename is not None else "I/O"
        return f"{where}: {exc.strerror or exc}"
    if isinstance(exc, OverflowError):
        return f"a value out of range: {exc}"
    import yaml

    if isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        where = f"{mark.name}, line {mark.line + 1}" if mark is not None else "YAML"
        return f"{where}: malformed YAML ({getattr(exc, 'problem', None) or exc})"
    try:
        from alembic.util import CommandError
    except ImportError:  # pragma: no cover - alembic is a runtime dependency
        CommandError = ()  # type: ignore[assignment,misc]
    if isinstance(exc, CommandError):
        return f"database revision: {_first_line(exc)}"
    from sqlalchemy.exc import SQLAlchemyError

    if isinstance(exc, SQLAlchemyError):
        return f"database: {_first_line(exc)}"
    return None


def is_debug() -> bool:
    return os.environ.get("FASTLLM_DEBUG", "") not in ("", "0")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
