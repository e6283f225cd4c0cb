"""The anomaly threshold the server wires into fastllm_operator_anomalies_total: the audit's
per-dtype default (fp32 1e-3, fp16 1e-2, bf16 5e-2; docs/verification.md) unless
`verify_threshold` overrides it, for every dtype and through the real wiring, so the counter and
`fastllm audit` count against the same number."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from runtime.engine.stats import VerificationResult
from runtime.server.wiring import build_state
from storage.audit import anomaly_threshold
from tests.runtime.server.live import engine_for, light_settings, router_of

PER_DTYPE = [("float32", 1e-3), ("float16", 1e-2), ("bfloat16", 5e-2)]


@pytest.mark.parametrize(("dtype", "expected"), PER_DTYPE)
def test_default_threshold_follows_the_serving_dtype(dtype: str, expected: float) -> None:
    assert anomaly_threshold(light_settings(dtype=dtype)) == expected


@pytest.mark.parametrize(("dtype", "_default"), PER_DTYPE)
@pytest.mark.parametrize("override", [0.25, 0.0])  # 0.0 is a setting, not "unset"
def test_verify_threshold_overrides_every_dtype(
    dtype: str, _default: float, override: float
) -> None:
    assert anomaly_threshold(light_settings(dtype=dtype, verify_threshold=override)) == override


@pytest.mark.parametrize(
    ("dtype", "override", "expected"),
    [("float16", None, 1e-2), ("bfloat16", None, 5e-2), ("float16", 0.5, 0.5)],
)
def test_the_wired_counter_counts_against_that_threshold(
    demo_model_dir: Callable[[str], Path], dtype: str, override: float | None, expected: float
) -> None:
    settings = light_settings(dtype=dtype, verify_threshold=override)
    make_router = router_of(llama=partial(engine_for, demo_model_dir("llama"), name="llama"))
    state = build_state(settings, make_router=make_router)  # engines load lazily: nothing runs
    assert state.monitoring is not None and state.registry is not None
    assert state.monitoring.prometheus.anomaly_threshold == expected
    # just inside and just outside the threshold: only the second is an anomaly
    results = [
        VerificationResult("r1", "llama", "stable", "swiglu", 1.0 + expected * 0.9, 1.0, 0.0),
        VerificationResult("r2", "llama", "stable", "swiglu", 1.0 + expected * 1.1, 1.0, 0.0),
    ]
    state.stats.record(verified=results)
    labels = {"model": "llama", "version": "stable", "op": "swiglu"}
    assert state.registry.get_sample_value("fastllm_operator_anomalies_total", labels) == 1.0
    for stop in state.on_stop:
        stop()
