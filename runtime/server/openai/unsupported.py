"""OpenAI request fields this server does not implement are refused, never silently ignored: a
client asking for legacy `functions` or a `suffix` must learn it does not get them. A field sent
with its neutral value (`suffix: ""`, `functions: []`, ...) asks for
nothing and passes; any other value is a 400 naming the field. Fields that are not OpenAI's
stay ignored, as in other OpenAI-compatible servers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic_core import PydanticCustomError

UNSUPPORTED = "unsupported_field"  # the pydantic error type (runtime.server.errors reads it)

_NONE: tuple[Any, ...] = (None,)
_EMPTY: tuple[Any, ...] = (None, [], {})

# field -> the values that ask for nothing (compared with ==); logprobs, echo, logit_bias, the
# penalties (runtime.engine.logits, .logprobs), n / best_of (runtime.engine.choices), tools and
# response_format (runtime.engine.constraints) are implemented
COMPLETION_FIELDS: dict[str, tuple[Any, ...]] = {
    "suffix": (None, ""),
}
CHAT_FIELDS: dict[str, tuple[Any, ...]] = {
    "functions": _EMPTY,
    "function_call": (None, "none"),
    "modalities": (None, ["text"]),
    "audio": _NONE,
    "prediction": _NONE,
}
EMBEDDING_FIELDS: dict[str, tuple[Any, ...]] = {"dimensions": _NONE}


def refuse_unsupported(data: Any, fields: Mapping[str, tuple[Any, ...]]) -> Any:
    """A model_validator(mode="before"): raises for the first unsupported field in use."""
    if not isinstance(data, dict):
        return data  # the model's own validation reports the wrong type
    for name, neutral in fields.items():
        if name in data and not _is_neutral(data[name], neutral):
            raise PydanticCustomError(
                UNSUPPORTED,
                "{field} is not supported by this server (send it unset or {neutral})",
                {"field": name, "neutral": _show(neutral)},
            )
    return data


def _is_neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    # bool is an int in Python: `true` must not pass as 1 (best_of), nor `1` as true (echo)
    return value is None or any(
        value == n and isinstance(value, bool) == isinstance(n, bool)
        for n in neutral
        if n is not None
    )


def _show(neutral: tuple[Any, ...]) -> str:
    shown = [json.dumps(n) for n in neutral if n is not None]
    return " or ".join(shown) if shown else "null"
