"""Tokens of the PromQL subset: numbers, durations, identifiers/keywords, strings, operators."""

from __future__ import annotations

import re
from dataclasses import dataclass

from alerts.errors import AlertRuleError

_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_UNITS_S["y"] = 365 * 86400.0
_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_TOKEN = re.compile(
    r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<duration>(?:\d+(?:ms|s|m|h|d|w|y))+(?!\w))
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^><=(){}\[\],])
    """,
    re.VERBOSE,
)
# Literal sizes, so that no literal can overflow a float or an int conversion (a 400-digit
# duration) or make one token the bulk of a query; each refusal names its limit.
MAX_NUMBER_CHARS = 64  # max_number_chars: "1e309" fits (it is +Inf, as in Prometheus)
MAX_DURATION_CHARS = 32  # max_duration_chars: "292y" is Prometheus' own ceiling
MAX_DURATION_S = 292 * 365 * 86400.0  # max_duration_s: Prometheus' durations are int64 ms
MAX_STRING_CHARS = 4096  # max_string_chars: a label value or regex
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}


@dataclass(frozen=True)
class Token:
    kind: str  # duration | number | ident | string | op | eof
    text: str
    pos: int


def parse_duration(text: str) -> float:
    """'1h30m' -> 5400.0 seconds; raises AlertRuleError on anything else."""
    if len(text) > MAX_DURATION_CHARS:
        raise AlertRuleError(
            f"duration {text[:40]!r}... longer than {MAX_DURATION_CHARS} characters "
            "(max_duration_chars)"
        )
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise AlertRuleError(f"invalid duration {text!r}")
    seconds = sum(int(n) * _UNITS_S[u] for n, u in parts)
    if seconds > MAX_DURATION_S:
        raise AlertRuleError(f"duration {text!r} longer than 292y (max_duration_s)")
    return seconds


def format_duration(seconds: float) -> str:
    """Inverse of parse_duration for whole milliseconds (used to print scaled rules)."""
    ms = round(seconds * 1000)
    if ms == 0:
        return "0s"
    out = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size:
            out.append(f"{ms // size}{unit}")
            ms %= size
    if ms:
        out.append(f"{ms}ms")
    return "".join(out)


def _unquote(text: str) -> str:
    if text[0] == "`":
        return text[1:-1]
    body, out, i = text[1:-1], [], 0
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body):
            out.append(_ESCAPES.get(body[i + 1], "\\" + body[i + 1]))
            i += 2
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


def _check_size(kind: str, text: str, pos: int) -> None:
    limit = {"number": MAX_NUMBER_CHARS, "string": MAX_STRING_CHARS + 2}.get(kind)
    if limit is not None and len(text) > limit:
        name = "max_number_chars" if kind == "number" else "max_string_chars"
        raise AlertRuleError(
            f"{kind} literal at {pos} longer than {limit - 2 * (kind == 'string')} "
            f"characters ({name})"
        )


def tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(source):
        match = _TOKEN.match(source, pos)
        if match is None:
            raise AlertRuleError(f"unexpected character {source[pos]!r} at {pos} in {source!r}")
        kind = match.lastgroup or ""
        text = match.group()
        _check_size(kind, text, pos)
        if kind == "string":
            tokens.append(Token(kind, _unquote(text), pos))
        elif kind != "space":
            tokens.append(Token(kind, text, pos))
        pos = match.end()
    tokens.append(Token("eof", "", len(source)))
    return tokens
