"""Speculative decoding's settings, checked once: a bad value is one `ConfigError` line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.errors import ConfigError

__all__ = ["SPEC_METHODS", "SpecConfig"]

SPEC_METHODS = ("off", "ngram", "self_draft")
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class SpecConfig:
    method: str = "off"  # off | ngram | self_draft
    num_speculative_tokens: int = 4  # k: tokens drafted per row and step (1..16)
    ngram_min: int = 2  # shortest suffix of the sequence looked up in its earlier tokens
    ngram_max: int = 4  # longest one (the longest match wins)
    draft_quant: str = "int4"  # self_draft: the draft's weights (int4 | int8)
    # a step with more rows than this runs without speculation (drafts steal compute there);
    # None: measured after the engine's warm-up sweep (spec/threshold.py), 8 without one
    max_batch_for_speculation: int | None = None
    # a request pauses drafting (state.py) when its recent acceptance, judged after at least
    # `min_drafts_to_judge` drafted tokens, is below this: its verified chunks cost more than the
    # tokens they save
    min_acceptance_ratio: float = 0.25
    min_drafts_to_judge: int = 8

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ConfigError(
                f"speculative_method={self.method!r}: expected one of {', '.join(SPEC_METHODS)}",
                param="speculative_method",
            )
        k = self.num_speculative_tokens
        if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(
                f"num_speculative_tokens={k}: expected 1..{MAX_SPECULATIVE_TOKENS}",
                param="num_speculative_tokens",
            )
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError(
                f"ngram_min={self.ngram_min}, ngram_max={self.ngram_max}: "
                "expected 1 <= ngram_min <= ngram_max",
                param="ngram_min",
            )
        if self.draft_quant not in ("int4", "int8"):
            raise ConfigError(
                f"speculative_draft_quant={self.draft_quant!r}: expected int4 or int8",
                param="speculative_draft_quant",
            )
        if self.max_batch_for_speculation is not None and self.max_batch_for_speculation < 1:
            raise ConfigError(
                f"max_batch_for_speculation={self.max_batch_for_speculation}: expected >= 1",
                param="max_batch_for_speculation",
            )

    @classmethod
    def from_settings(cls, settings: Any) -> SpecConfig:
        return cls(
            method=settings.speculative_method,
            num_speculative_tokens=settings.num_speculative_tokens,
            ngram_min=settings.ngram_min,
            ngram_max=settings.ngram_max,
            draft_quant=settings.speculative_draft_quant,
            max_batch_for_speculation=settings.max_batch_for_speculation,
        )

    @property
    def enabled(self) -> bool:
        return self.method != "off"
