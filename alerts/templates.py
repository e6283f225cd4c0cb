"""Annotation/label templates: the part of Prometheus' Go text/template language that rules
use, `{{ $labels.name }}`, `{{ $value }}` and pipes into humanize / humanize1024 /
humanizePercentage, formatted exactly as Go does (the parity test compares with promtool).
Anything else is rejected when the rules load.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from alerts.errors import AlertRuleError

_ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.DOTALL)
_LABEL_REF = re.compile(r"^(?:\$labels|\.Labels)\.([a-zA-Z_][a-zA-Z0-9_]*)$")


def _special(v: float) -> str | None:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return None


def go_g(v: float, precision: int | None = None) -> str:
    """Go's %.<precision>g, or %v (shortest representation) when precision is None."""
    special = _special(v)
    if special is not None:
        return special
    if precision is not None:
        return f"{v:.{precision}g}"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    sign, digit_tuple, exponent = Decimal(repr(v)).normalize().as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    exp10 = len(digits) + exponent - 1
    prefix = "-" if sign else ""
    # strconv 'g' with shortest precision switches to an exponent outside [-4, 6)
    if exp10 < -4 or exp10 >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{prefix}{mantissa}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"
    return prefix + format(Decimal(repr(abs(v))).normalize(), "f")


def _scaled(v: float, base: float, big: tuple[str, ...], small: tuple[str, ...]) -> str:
    prefix = ""
    if abs(v) >= 1:
        for p in big:
            if abs(v) < base:
                break
            prefix, v = p, v / base
    else:
        for p in small:
            if abs(v) >= 1:
                break
            prefix, v = p, v * base
    return f"{go_g(v, 4)}{prefix}"


def humanize(v: float) -> str:
    if v == 0 or _special(v) is not None:
        return go_g(v, 4)
    return _scaled(v, 1000.0, tuple("kMGTPEZY"), ("m", "u", "n", "p", "f", "a", "z", "y"))


def humanize1024(v: float) -> str:
    if abs(v) <= 1 or _special(v) is not None:
        return go_g(v, 4)
    return _scaled(v, 1024.0, ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"), ())


def humanize_percentage(v: float) -> str:
    return go_g(v * 100, 4) + "%"


FUNCTIONS: dict[str, Callable[[float], str]] = {
    "humanize": humanize,
    "humanize1024": humanize1024,
    "humanizePercentage": humanize_percentage,
}


@dataclass(frozen=True)
class Template:
    """A parsed template: literal text and actions, alternating."""

    source: str
    parts: tuple[str | tuple[str, tuple[str, ...]], ...]  # text | (subject, pipe functions)

    @classmethod
    def parse(cls, source: str) -> Template:
        parts: list[str | tuple[str, tuple[str, ...]]] = []
        pos = 0
        for match in _ACTION.finditer(source):
            parts.append(source[pos : match.start()])
            pipeline = [p.strip() for p in match.group(1).split("|")]
            subject, funcs = pipeline[0], tuple(pipeline[1:])
            if subject not in ("$value", ".Value") and not _LABEL_REF.match(subject):
                raise AlertRuleError(f"template action {{{{ {match.group(1)} }}}} not supported")
            for fn in funcs:
                if fn not in FUNCTIONS:
                    raise AlertRuleError(f"template function {fn!r} not supported")
            if funcs and (subject not in ("$value", ".Value") or len(funcs) > 1):
                raise AlertRuleError("one template function, applied to $value, at most")
            parts.append((subject, funcs))
            pos = match.end()
        parts.append(source[pos:])
        if "{{" in "".join(p for p in parts if isinstance(p, str)):
            raise AlertRuleError(f"unbalanced template braces in {source!r}")
        return cls(source, tuple(parts))

    def render(self, labels: Mapping[str, str], value: float) -> str:
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            subject, funcs = part
            label = _LABEL_REF.match(subject)
            if label:
                # Go renders a missing map key as "<no value>"
                out.append(labels.get(label.group(1), "<no value>"))
            elif funcs:
                out.append(FUNCTIONS[funcs[0]](value))
            else:
                out.append(go_g(value))
        return "".join(out)
