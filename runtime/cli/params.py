"""Numeric option types that refuse what click's own let through.

`click.FloatRange` compares with `<`/`>`, and every comparison with NaN is false, so `nan` passes
any range (`fastllm audit --threshold nan` reported a silent all-clear); `inf` passes a range
without a maximum. `Finite` refuses both and needs a maximum; `Bounded` is an int range with one
(a 400-digit integer is refused with the option's name, not an overflow further in).
"""

from __future__ import annotations

import math
from typing import Any

import click

__all__ = ["Bounded", "Finite"]


class Finite(click.FloatRange):
    name = "finite float"

    def __init__(self, min: float, max: float, *, min_open: bool = False) -> None:
        super().__init__(min=min, max=max, min_open=min_open)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


class Bounded(click.IntRange):
    name = "bounded integer"

    def __init__(self, min: int, max: int) -> None:
        super().__init__(min=min, max=max)
