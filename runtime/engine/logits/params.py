"""The logits-controls and logprobs bounds, kept importable here; the checks live in
runtime.engine.sampling.checks (every check of SamplingParams in one place)."""

from runtime.engine.sampling.checks import (
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    PENALTY_BOUNDS,
    check_token_ids,
)

__all__ = ["MAX_LOGIT_BIAS", "MAX_LOGPROBS", "PENALTY_BOUNDS", "check_token_ids"]
