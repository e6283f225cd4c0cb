"""The storage package's errors (the whole tree is drawn in runtime/errors.py)."""

from __future__ import annotations

from runtime.errors import FastllmError

__all__ = ["StorageError"]


class StorageError(FastllmError):
    """The database is unreachable, misconfigured or cannot be migrated."""

    http_status = 503
    error_type = "storage_error"
