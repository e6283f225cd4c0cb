"""The configs compose mounts, checked by the real tools: `promtool check config` on the
Prometheus config (rule_files resolved the way compose mounts them) and `amtool check-config` on
Alertmanager's; plus the collector's pipelines naming only components it defines."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.conftest import require_binary
from tests.deploy import stack


def _container_to_host() -> dict[str, Path]:
    """Container path -> repo path for the Prometheus service's bind mounts."""
    prometheus = stack.services()["prometheus"]
    return {m.target: stack.host_path(m) for m in stack.mounts(prometheus) if m.is_bind}


def test_promtool_check_config_passes(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    config = stack.load_yaml(stack.REPO / "deploy" / "prometheus.yml")
    mounted = _container_to_host()
    rewritten = []
    for pattern in config["rule_files"]:
        target = max((t for t in mounted if pattern.startswith(t + "/")), key=len, default=None)
        assert target is not None, f"rule_files {pattern} is not under a mounted directory"
        rewritten.append(str(mounted[target]) + pattern[len(target) :])
    config["rule_files"] = rewritten
    copy = tmp_path / "prometheus.yml"
    copy.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [promtool, "check", "config", str(copy)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rules found" in done.stdout  # the rule files were found and checked too


def test_prometheus_scrapes_every_runtime_replica_and_alerts_alertmanager() -> None:
    config = stack.load_yaml(stack.REPO / "deploy" / "prometheus.yml")
    runtime_ports = stack.listening_ports(stack.services()["runtime"])
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    sd = jobs["fastllm"]["dns_sd_configs"]
    names = {name for entry in sd for name in entry["names"]}
    assert {"runtime", "tasks.runtime"} <= names
    assert all(entry["type"] == "A" and entry["port"] in runtime_ports for entry in sd)
    targets = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert targets == ["alertmanager:9093"]


def test_amtool_check_config_passes() -> None:
    amtool = require_binary("amtool")
    done = subprocess.run(
        [amtool, "check-config", str(stack.REPO / "deploy" / "alertmanager.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_collector_pipelines_name_only_defined_components() -> None:
    config = stack.load_yaml(stack.REPO / "deploy" / "otel-collector.yaml")
    service = config["service"]
    for extension in service.get("extensions", []):
        assert extension in (config.get("extensions") or {}), extension
    assert service["pipelines"], "no pipelines"
    for name, pipeline in service["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in (config.get(kind) or {}), (
                    f"{name}: undefined {kind} {component}"
                )
    traces = service["pipelines"]["traces"]
    assert "batch" in traces["processors"]
    exporter = config["exporters"][traces["exporters"][0]]
    assert traces["exporters"][0].split("/")[0] == "otlp" and exporter["endpoint"] == "jaeger:4317"


def test_collector_receivers_bind_all_interfaces() -> None:
    config = stack.load_yaml(stack.REPO / "deploy" / "otel-collector.yaml")
    protocols = config["receivers"]["otlp"]["protocols"]
    assert set(protocols) == {"grpc", "http"}
    for protocol in protocols.values():
        assert protocol["endpoint"].startswith("0.0.0.0:")
    # the runtime's OTLP/HTTP endpoint is the collector's http receiver
    env = stack.services()["runtime"]["environment"]
    http_port = protocols["http"]["endpoint"].rsplit(":", 1)[1]
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://otel-collector:{http_port}"
    jaeger = stack.services()["jaeger"]
    assert jaeger["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
