"""The n-gram proposer and the settings' one-line errors."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.config import load_settings
from runtime.engine.spec.config import SpecConfig
from runtime.engine.spec.ngram import propose_ngram
from runtime.errors import ConfigError


def test_ngram_proposes_what_followed_the_most_recent_longest_match() -> None:
    tokens = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3]
    # suffix [1, 2, 3] recurs at 0 (followed by 4, 5); [2, 3] more recently (followed by 7, 8)
    assert propose_ngram(tokens, 2, 1, 3) == [4, 5]
    assert propose_ngram(tokens, 2, 1, 2) == [7, 8]
    assert propose_ngram(tokens, 5, 1, 3) == [4, 5, 9, 2, 3]
    assert propose_ngram([1, 2, 3, 4], 3, 1, 4) == []  # nothing recurs
    assert propose_ngram([7, 7], 3, 1, 2) == [7]  # only what is there
    assert propose_ngram([5], 3, 1, 2) == []


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"num_speculative_tokens": 17}, "num_speculative_tokens"),
        ({"method": "eagle"}, "speculative_method"),
        ({"draft_quant": "fp8"}, "speculative_draft_quant"),
        ({"ngram_min": 3, "ngram_max": 2}, "ngram_min"),
        ({"max_batch_for_speculation": 0}, "max_batch_for_speculation"),
    ],
)
def test_bad_spec_config_is_one_line_config_error(kwargs: dict[str, object], param: str) -> None:
    with pytest.raises(ConfigError) as info:
        SpecConfig(**{"method": "ngram", **kwargs})  # type: ignore[arg-type]
    assert info.value.param == param
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "flags",
    [
        {"num_speculative_tokens": 0},
        {"num_speculative_tokens": 17},
        {"speculative_method": "medusa"},
        {"speculative_draft_quant": "fp8"},
    ],
)
def test_bad_spec_settings_are_one_line_errors(flags: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(**flags)
    assert "\n" not in str(info.value)
    assert info.value.param == next(iter(flags))


def test_settings_reach_the_engine_config() -> None:
    from runtime.engine.config import EngineConfig

    settings = load_settings(speculative_method="ngram", num_speculative_tokens=6, ngram_max=3)
    spec = EngineConfig.from_settings(settings).spec
    assert (spec.method, spec.num_speculative_tokens, spec.ngram_max) == ("ngram", 6, 3)
    assert not EngineConfig().spec.enabled  # off by default
