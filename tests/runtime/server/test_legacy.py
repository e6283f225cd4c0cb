"""Legacy mode: a pytorch_model.bin-only model loads (with a warning and legacy="true" on
fastllm_build_info) and the deprecated POST /predict answers with deprecation headers; with legacy
mode off the same directory is refused naming `fastllm convert`, and /predict does not exist."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime.engine.offline import generate
from runtime.engine.sampling import SamplingParams
from runtime.models.loader import load_model
from tests.runtime.models.builders import to_legacy
from tests.runtime.server.live import API_KEY, engine_for, light_settings, live_server, router_of

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture
def legacy_dir(demo_model_dir: Callable[[str], Path], tmp_path: Path) -> Path:
    return to_legacy(shutil.copytree(demo_model_dir("llama"), tmp_path / "legacy"))


def test_legacy_mode_serves_predict_with_deprecation_headers(
    legacy_dir: Path,
    demo_model_dir: Callable[[str], Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="fastllm.models")
    make = router_of(
        llama=lambda sink: engine_for(legacy_dir, sink, name="llama", legacy_support=True)
    )
    settings = light_settings(legacy_support=True, model_name="llama")
    with live_server(settings, make) as server:
        response = httpx.post(
            f"{server.url}/predict", json={"prompt": "The cache", "max_length": 6}, headers=AUTH
        )
        assert response.status_code == 200, response.text
        assert response.headers["Deprecation"] == "true"
        assert "/v1/completions" in response.headers["Link"]
        assert "/v1/completions" in response.headers["Warning"]
        # the same greedy completion the library gives for the safetensors original
        reference = load_model(demo_model_dir("llama"))
        (expected,) = generate(
            reference, ["The cache"], SamplingParams(max_tokens=6, temperature=0.0)
        )
        assert response.json() == {"text": expected.text}
        refused = httpx.post(
            f"{server.url}/predict", json={"prompt": "x", "max_len": 3}, headers=AUTH
        )
        assert refused.status_code == 400
        assert httpx.post(f"{server.url}/predict", json={"prompt": "x"}).status_code == 401
        metrics = httpx.get(f"{server.url}/metrics").text
    (info,) = [
        s
        for f in text_string_to_metric_families(metrics)
        for s in f.samples
        if s.name == "fastllm_build_info"
    ]
    assert info.labels["legacy"] == "true"
    assert any("legacy pytorch_model.bin" in r.getMessage() for r in caplog.records)


def test_legacy_only_directory_is_refused_when_legacy_mode_is_off(legacy_dir: Path) -> None:
    make = router_of(llama=lambda sink: engine_for(legacy_dir, sink, name="llama"))
    with live_server(light_settings(model_name="llama"), make, wait_ready=False) as server:
        deadline = time.monotonic() + 60
        while (ready := httpx.get(f"{server.url}/ready").json())["status"] == "loading":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert ready["status"] == "failed"
        assert "fastllm convert --input" in ready["detail"]
        predict = httpx.post(f"{server.url}/predict", json={"prompt": "x"}, headers=AUTH)
        assert predict.status_code == 404


def test_predict_is_absent_without_legacy_mode(demo_model_dir: Callable[[str], Path]) -> None:
    make = router_of(llama=lambda sink: engine_for(demo_model_dir("llama"), sink, name="llama"))
    with live_server(light_settings(model_name="llama"), make) as server:
        assert (
            httpx.post(f"{server.url}/predict", json={"prompt": "x"}, headers=AUTH).status_code
            == 404
        )
        schema = httpx.get(f"{server.url}/openapi.json").json()
        assert "/predict" not in schema["paths"]
