"""deploy/k8s rendered by `kubectl kustomize` for each overlay: every built-in object validates
offline against the Kubernetes schema (kubernetes-validate, strict); the PrometheusRule's groups
are alerts/rules and pass `promtool check rules`; the dashboard ConfigMaps hold
dashboards/generated/ byte for byte; both generated files are fresh (the CLI's --check)."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from alerts.export import rule_groups
from dashboards.build import GENERATED_DIR
from runtime.cli import main
from tests.conftest import require_binary
from tests.deploy import k8s

SCHEMA_VERSION = "1.30"  # the oldest Kubernetes the manifests are written for
EXPECTED_KINDS = {
    "Namespace",
    "ConfigMap",
    "PersistentVolumeClaim",
    "Deployment",
    "Service",
    "PodDisruptionBudget",
    "ServiceMonitor",
    "PrometheusRule",
    "ScaledObject",
    "HTTPRoute",
}
RULE_FILE = k8s.K8S / "base" / "prometheus-rule.yaml"
DASHBOARD_FILE = k8s.K8S / "base" / "grafana-dashboards.yaml"


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_overlay_renders_every_kind_into_one_namespace(overlay: str) -> None:
    objects = k8s.render(overlay)
    assert {o["kind"] for o in objects} == EXPECTED_KINDS
    namespaced = [o for o in objects if o["kind"] != "Namespace"]
    assert {o["metadata"].get("namespace") for o in namespaced} == {"fastllm"}


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_builtin_objects_validate_against_the_kubernetes_schema(overlay: str) -> None:
    builtin = [o for o in k8s.render(overlay) if k8s.is_builtin(o)]
    assert {o["kind"] for o in builtin} >= {"Deployment", "Service", "PodDisruptionBudget"}
    for obj in builtin:
        kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
    # and the validator does reject what a cluster would: a misspelled field, a wrong type
    deployment = copy.deepcopy(k8s.of_kind(builtin, "Deployment")[0])
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 60
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, SCHEMA_VERSION, strict=True)
    deployment = copy.deepcopy(k8s.of_kind(builtin, "Deployment")[0])
    k8s.runtime_container(deployment)["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, SCHEMA_VERSION, strict=True)


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_prometheus_rule_is_alerts_rules_and_passes_promtool(overlay: str, tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    (rule,) = k8s.of_kind(k8s.render(overlay), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    groups = rule["spec"]["groups"]
    assert groups == rule_groups()  # every group of alerts/rules/*.yml, unchanged
    path = tmp_path / "from-k8s.rules.yml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups)} rules found" in done.stdout


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_dashboard_configmaps_hold_the_generated_json(overlay: str) -> None:
    maps = [
        o
        for o in k8s.of_kind(k8s.render(overlay), "ConfigMap")
        if o["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
    ]
    held = {name: text for m in maps for name, text in m["data"].items()}
    generated = {p.name: p.read_text(encoding="utf-8") for p in GENERATED_DIR.glob("*.json")}
    assert held == generated
    assert all(m["metadata"]["annotations"]["grafana_folder"] == "fastllm" for m in maps)


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
        raise SystemExit(0)
    captured = capsys.readouterr()
    return int(exc.value.code or 0), captured.out + captured.err


def test_generated_files_are_fresh_and_a_stale_one_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    alerts = ["alerts", "export", "--format", "prometheus-rule", "--check"]
    dashboards = ["dashboards", "export", "--format", "configmap", "--check"]
    assert _cli([*alerts, "--out", str(RULE_FILE)], capsys)[0] == 0
    assert _cli([*dashboards, "--out", str(DASHBOARD_FILE)], capsys)[0] == 0
    for argv, source in ((alerts, RULE_FILE), (dashboards, DASHBOARD_FILE)):
        stale = tmp_path / source.name
        stale.write_text(source.read_text().replace("fastllm", "fastllm-old", 1))
        rc, out = _cli([*argv, "--out", str(stale)], capsys)
        assert rc == 1 and f"{stale}: stale" in out
        rc, out = _cli([*argv, "--out", str(tmp_path / "missing.yaml")], capsys)
        assert rc == 1 and "missing" in out
    written = tmp_path / "rule.yaml"
    assert (
        _cli(["alerts", "export", "--format", "prometheus-rule", "--out", str(written)], capsys)[0]
        == 0
    )
    assert written.read_text() == RULE_FILE.read_text()
