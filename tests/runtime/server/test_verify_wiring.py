"""The server wires runtime.verify: with verify_sample_rate 1.0 every completion leaves its probes
in inference_log (the logit on the request's row) and the anomaly counter uses the audit's
per-dtype threshold."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx
from sqlalchemy import select

from storage.audit import default_threshold
from storage.db import make_engine
from storage.models import InferenceLog
from tests.runtime.server.live import API_KEY, engine_for, light_settings, live_server, router_of


def test_completions_are_verified_and_stored(
    tmp_path: Path, demo_model_dir: Callable[[str], Path]
) -> None:
    url = f"sqlite:///{tmp_path / 'fastllm.db'}"
    settings = light_settings(storage_enabled=True, database_url=url, verify_sample_rate=1.0)
    make_router = router_of(llama=partial(engine_for, demo_model_dir("llama"), name="llama"))
    with live_server(settings, make_router) as server:
        assert server.state.monitoring is not None
        assert server.state.monitoring.prometheus.anomaly_threshold == default_threshold("float32")
        for i in range(3):
            response = httpx.post(
                f"{server.url}/v1/completions",
                json={"model": "llama", "prompt": f"hello {i}", "max_tokens": 2},
                headers={"Authorization": f"Bearer {API_KEY}"},
                timeout=60,
            )
            assert response.status_code == 200, response.text
        registry = server.state.registry
    # stopped: the verifier finished its queue, then the writer flushed
    engine = make_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(select(InferenceLog.status, InferenceLog.op)).all()
    engine.dispose()
    requests = [op for status, op in rows if status != "probe"]
    probes = sorted(op for status, op in rows if status == "probe")
    assert requests == ["logit"] * 3
    assert probes == sorted(["attention", "rms_norm", "rotary", "swiglu"] * 3)
    labels = {"model": "llama", "version": "stable", "op": "swiglu"}
    assert registry.get_sample_value("fastllm_operator_anomalies_total", labels) == 0
