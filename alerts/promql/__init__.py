"""A small PromQL evaluator for the subset fastllm's alert rules use (see parser.py)."""

from alerts.promql.engine import Evaluator, SeriesSource
from alerts.promql.lexer import format_duration, parse_duration
from alerts.promql.parser import parse, type_of
from alerts.promql.scale import scale_durations, selected_names
from alerts.promql.types import LOOKBACK_S, Labels, Matcher, Sample, Series, make_labels

__all__ = [
    "LOOKBACK_S",
    "Evaluator",
    "Labels",
    "Matcher",
    "Sample",
    "Series",
    "SeriesSource",
    "format_duration",
    "make_labels",
    "parse",
    "parse_duration",
    "scale_durations",
    "selected_names",
    "type_of",
]
