"""`fastllm alerts check` and `fastllm alerts run`, through the real console entry point."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from runtime.cli import main
from tests.conftest import require_binary


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_check_accepts_the_shipped_rules(capsys) -> None:
    require_binary("promtool")
    code, out = _run(["alerts", "check"], capsys)
    assert code == 0, out
    assert "13 alerting rules parse" in out
    assert "SUCCESS: 13 rules found" in out  # promtool agreed


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("rate(x[5m:1m]) > 0", "subqueries are not supported"),
        ("quantile_over_time(0.9, x[5m]) > 1", "not supported"),
        ("x > on(a) group_left y", "group_left"),
        ("sum(rate(x[5m]) > 0", "expected )"),
    ],
)
def test_check_rejects_rules_outside_the_subset(tmp_path: Path, capsys, expr, message) -> None:
    rules = tmp_path / "bad.yml"
    rules.write_text("groups:\n- name: g\n  rules:\n  - alert: Bad\n    expr: '" + expr + "'\n")
    code, out = _run(["alerts", "check", "--rules", str(rules), "--no-promtool"], capsys)
    assert code == 2
    assert message in out


def test_run_evaluates_a_scraped_runtime(capsys) -> None:
    registry = CollectorRegistry()
    gauge = Gauge("fastllm_device_utilization_ratio", "u", ["device"], registry=registry)
    gauge.labels(device="cpu").set(0.3)
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        port = server.server_address[1]
        code, out = _run(
            [
                "alerts",
                "run",
                "--metrics-url",
                f"http://127.0.0.1:{port}/metrics",
                "--interval",
                "0.05",
                "--time-scale",
                "0.0005",
                "--rounds",
                "20",
            ],
            capsys,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0, out
    assert "pending  FastllmDeviceUtilizationLow" in out
    assert "firing   FastllmDeviceUtilizationLow" in out
    assert "FastllmRuntimeDown" not in out  # the scrape worked: up == 1


def test_run_reports_an_unreachable_runtime(capsys) -> None:
    code, out = _run(
        [
            "alerts",
            "run",
            "--metrics-url",
            "http://127.0.0.1:9/metrics",
            "--interval",
            "0.05",
            "--time-scale",
            "0.0005",
            "--rounds",
            "6",
        ],
        capsys,
    )
    assert code == 0, out
    assert "firing   FastllmRuntimeDown" in out
