"""`fastllm doctor`: passes on the demo models; fails naming the cause on a legacy GeGLU checkpoint
converted without --fix-geglu, on a corrupted op, on an unmigrated database, on a bad scrape."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, start_http_server

from monitoring.metrics import FastllmMetrics
from runtime.cli import main
from runtime.models import ops
from runtime.tools.convert import convert_checkpoint
from runtime.tools.doctor import FAIL, PASS, DoctorOptions, check_metrics, run_checks
from storage.db import open_database
from tests.runtime.models.builders import to_legacy


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'fastllm.db'}"
    open_database(url).dispose()  # migrated
    return url


def _failed(results: list) -> dict[str, str]:
    return {r.name: r.detail for r in results if r.status == FAIL}


def _doctor(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(["doctor", *argv])
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out + err


@pytest.mark.parametrize("arch", ["llama", "gemma", "bert"])
def test_passes_on_the_demo_models(
    arch: str, demo_model_dir: Callable[[str], Path], db_url: str
) -> None:
    results = run_checks(DoctorOptions(model_path=demo_model_dir(arch), database_url=db_url))
    assert _failed(results) == {}
    names = {r.name for r in results if r.status == PASS}
    assert {"GeGLU weights normalised", "tokenizer round trip and ranges"} <= names
    assert {"op geglu vs geglu_ref", "op swiglu vs swiglu_ref"} <= names
    assert "database reachable and migrated" in names


def test_cli_exits_zero_and_prints_the_table(
    demo_model_dir: Callable[[str], Path], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, text = _doctor(["--model", str(demo_model_dir("llama")), "--database-url", db_url], capsys)
    assert rc == 0, text
    assert "all checks passed" in text and "op attention vs attention_ref" in text


def test_legacy_geglu_converted_without_fix_fails_naming_the_cause(
    demo_model_dir: Callable[[str], Path],
    tmp_path: Path,
    db_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    legacy = to_legacy(shutil.copytree(demo_model_dir("gemma"), tmp_path / "legacy"))
    convert_checkpoint(legacy, tmp_path / "unfixed")  # no --fix-geglu
    rc, text = _doctor(["--model", str(tmp_path / "unfixed"), "--database-url", db_url], capsys)
    assert rc == 1
    line = next(x for x in text.splitlines() if x.startswith("FAIL GeGLU weights normalised"))
    assert "converted from a legacy file without --fix-geglu" in line
    assert "--fix-geglu" in text.split(line, 1)[1].splitlines()[1]  # the fix follows
    # the same legacy file converted with the fix is fine
    convert_checkpoint(legacy, tmp_path / "fixed", fix_geglu=True)
    results = run_checks(DoctorOptions(model_path=tmp_path / "fixed", database_url=db_url))
    assert _failed(results) == {}
    # loading the legacy file itself (legacy mode) is flagged too
    results = run_checks(DoctorOptions(model_path=legacy, legacy_support=True))
    assert "legacy pytorch_model.bin" in _failed(results)["GeGLU weights normalised"]


def test_corrupted_op_fails_naming_the_op(
    demo_model_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, db_url: str
) -> None:
    reference = ops.geglu_ref
    monkeypatch.setattr(ops, "geglu", lambda gate, up: reference(gate, up) * 1.01)
    results = run_checks(DoctorOptions(model_path=demo_model_dir("gemma"), database_url=db_url))
    assert list(_failed(results)) == ["op geglu vs geglu_ref"]
    fix = next(r.fix for r in results if r.status == FAIL)
    assert "`geglu` kernel disagrees" in fix


def test_legacy_only_directory_fails_with_the_convert_command(
    demo_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    legacy = to_legacy(shutil.copytree(demo_model_dir("llama"), tmp_path / "legacy"))
    results = run_checks(DoctorOptions(model_path=legacy))
    load = next(r for r in results if r.name.startswith("model loads"))
    assert load.status == FAIL and "fastllm convert --input" in load.fix


def test_unmigrated_database_fails(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    results = run_checks(DoctorOptions(database_url=f"sqlite:///{path}"))
    assert "at revision None" in _failed(results)["database reachable and migrated"]
    missing = run_checks(DoctorOptions(database_url=f"sqlite:///{tmp_path / 'nope.db'}"))
    assert "does not exist" in _failed(missing)["database reachable and migrated"]
    assert not (tmp_path / "nope.db").exists()


@pytest.fixture
def metrics_server() -> Iterator[Callable[[CollectorRegistry], str]]:
    servers = []

    def serve(registry: CollectorRegistry) -> str:
        server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}/metrics"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def test_metrics_scrape(metrics_server: Callable[[CollectorRegistry], str]) -> None:
    runtime_registry = CollectorRegistry()
    FastllmMetrics.create(runtime_registry, latency_buckets_s=[0.1, 1.0])
    assert check_metrics(metrics_server(runtime_registry)).status == PASS
    other = CollectorRegistry()
    Counter("something_else_total", "not ours", registry=other)
    result = check_metrics(metrics_server(other))
    assert result.status == FAIL and "no fastllm_* metrics" in result.detail
    assert check_metrics("http://127.0.0.1:9/metrics").status == FAIL  # nothing listens


def test_metrics_scrape_reports_a_compile_fallback(
    metrics_server: Callable[[CollectorRegistry], str],
) -> None:
    registry = CollectorRegistry()
    metrics = FastllmMetrics.create(registry, latency_buckets_s=[0.1, 1.0])
    metrics.compile_fallbacks.labels("tiny", "v1").set(0)  # compiled and running: fine
    assert check_metrics(metrics_server(registry)).status == PASS
    metrics.compile_fallbacks.labels("tiny", "v1").set(1)
    result = check_metrics(metrics_server(registry))
    assert result.status == FAIL and "fell back to the eager forward for tiny" in result.detail
    assert "--compile off" in result.fix


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_doctor_compares_every_quantized_linear_with_its_reference(
    method: str, demo_model_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.models.quant import Int4Linear, Int8Linear

    options = DoctorOptions(model_path=demo_model_dir("llama"), quantization=method)
    results = run_checks(options)
    assert _failed(results) == {}
    check = next(r for r in results if r.name.startswith("quantized linears"))
    assert check.status == PASS and f"{method} layers" in check.detail
    # a kernel that is off by 2% fails, naming the check
    layer_cls = Int4Linear if method == "int4" else Int8Linear
    intact = layer_cls.forward
    monkeypatch.setattr(layer_cls, "forward", lambda self, x: intact(self, x) * 1.02)
    failed = _failed(run_checks(options))
    assert "quantized linears vs their dequantized reference" in failed
