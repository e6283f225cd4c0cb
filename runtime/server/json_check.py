"""Text is validated once, at the edge: a JSON body whose strings are not valid Unicode text (a
lone surrogate escape such as "\\ud800", which UTF-8 cannot encode) is refused with a 400 naming
the field, before any of it reaches the tokenizer, a metric label, a span attribute or an
inference_log row.

The usual body costs one memchr: a lone surrogate needs a `\\uD800`-`\\uDFFF` escape in the raw
bytes (they are valid UTF-8 by then), so only a body with a backslash is searched for one, and
only one with such an escape is parsed and walked (then nesting deeper than MAX_JSON_DEPTH is
refused too). Deeper nesting elsewhere is FastAPI's to refuse (its parser raises, a counted 400).
A body that is not JSON at all is left to FastAPI, which answers it with its own 400.
"""

from __future__ import annotations

import json
import re
from typing import Any

from runtime.server.body import Refusal

MAX_JSON_DEPTH = 64  # the API's bodies nest 4 deep (messages[i].content); this is generous
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def check_json(body: bytes) -> Refusal | None:
    if b"\\" not in body or _SURROGATE_ESCAPE.search(body) is None:
        return None
    try:
        document = json.loads(body)
    except RecursionError:  # deeper than the parser's own stack
        return _too_deep()
    except ValueError:  # not JSON: FastAPI says so
        return None
    return _walk(document)


def _too_deep() -> Refusal:
    return Refusal(400, f"request body nests deeper than {MAX_JSON_DEPTH} levels")


def _walk(document: Any) -> Refusal | None:
    """Iterative (a deep document must not exhaust the stack here either)."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(document, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_JSON_DEPTH:
            return _too_deep()
        if isinstance(value, str):
            if not _is_text(value):
                return _not_text(path)
        elif isinstance(value, dict):
            for key, item in value.items():
                if not _is_text(key):
                    return _not_text(path, key="a key")
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, str(i))) for i, item in enumerate(value))
    return None


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_text(path: tuple[str, ...], *, key: str | None = None) -> Refusal:
    where = ".".join(path) or "body"
    what = f"{key} of {where}" if key else where
    message = f"{what}: text must be valid Unicode (it holds a lone surrogate escape, e.g. \\ud800)"
    return Refusal(400, message, param=path[0] if path else None)
