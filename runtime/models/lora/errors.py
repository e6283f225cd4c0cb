"""The adapter's own error: a bad adapter is the caller's mistake (400 on the API, exit 2 on the
CLI), said in one line naming the file or tensor."""

from __future__ import annotations

from runtime.errors import InvalidRequestError


class LoraAdapterError(InvalidRequestError):
    """Missing files, a pickle, wrong shapes, a rank above the bound, an unsupported option, a
    path outside the adapter directory."""
