"""Why a request ended: the finish reasons of a completed request and the failure reasons of one
that did not complete. Both are str-valued, so JSON bodies, metric labels, span attributes and
`inference_log.status` read exactly as the plain strings did (`FinishReason.STOP == "stop"`)."""

from __future__ import annotations

from enum import Enum

__all__ = ["FailureReason", "FinishReason"]


class _StrEnum(str, Enum):
    """A str whose str() and format() are its value on every Python this project supports."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class FinishReason(_StrEnum):
    STOP = "stop"  # eos, a stop token id or a stop string
    LENGTH = "length"  # max_tokens reached
    CANCELLED = "cancelled"  # the client went away or cancelled


class FailureReason(_StrEnum):
    VALIDATION = "validation"  # the request was refused as invalid (4xx)
    OVERLOADED = "overloaded"  # admission refused (429)
    INTERNAL = "internal"  # a model step or a replica failed (5xx)
    TIMEOUT = "timeout"  # the request ran past its deadline
    UNAUTHORIZED = "unauthorized"  # refused before authentication (counted, no inference_log row)
