"""deploy/k8s objects agree with the app and with each other: probes hit real routes on the real
port; every FASTLLM_* variable is a setting and the values validate; no secret is a literal; the
grace period outlasts preStop + drain; pods run non-root on a read-only root with the weights
read-only; Services, the ServiceMonitor, the PDB, KEDA and the HTTPRoute point at what exists;
the gpu overlay asks for a GPU and the cpu one does not."""

from __future__ import annotations

import functools
import os
import re
from typing import Any

import pytest

from alerts.promql import parse
from alerts.promql.scale import selected_names
from monitoring.metric_names import CONTRACT_METRIC_NAMES
from runtime.config import Settings
from tests.deploy import k8s

SECRET_NAMES = re.compile(r"TOKEN|KEY|PASSWORD|SECRET|DATABASE_URL")


@functools.lru_cache(maxsize=1)
def _app_paths() -> frozenset[str]:
    from runtime.server import create_app

    settings = Settings(
        model_path="/nonexistent", device="cpu", storage_enabled=False, alerts_enabled=False
    )
    return frozenset(create_app(settings).openapi()["paths"])


def _deployments(overlay: str) -> list[dict[str, Any]]:
    return k8s.of_kind(k8s.render(overlay), "Deployment")


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_probes_hit_real_routes_on_the_configured_port(overlay: str) -> None:
    objects = k8s.render(overlay)
    for deployment in _deployments(overlay):
        container = k8s.runtime_container(deployment)
        (port,) = container["ports"]
        assert port["containerPort"] == int(k8s.environment(objects, deployment)["FASTLLM_PORT"])
        paths = {}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = container[probe]["httpGet"]
            assert get["port"] == port["name"], probe
            paths[probe] = get["path"]
        assert set(paths.values()) <= _app_paths()
        assert paths["readinessProbe"] == paths["startupProbe"] == "/ready"  # 503 until loaded
        assert paths["livenessProbe"] == "/health"  # alive whatever the model does


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_every_variable_is_a_setting_and_the_values_validate(
    overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = k8s.render(overlay)
    fields = set(Settings.model_fields)
    for deployment in _deployments(overlay):
        env = k8s.environment(objects, deployment)
        for name in env:
            assert name.startswith("FASTLLM_"), f"{name} is not a FASTLLM_* setting"
            assert name.removeprefix("FASTLLM_").lower() in fields, f"{name} is no setting"
        for key in [k for k in os.environ if k.startswith("FASTLLM_")]:
            monkeypatch.delenv(key)
        for name, value in env.items():  # secrets: what a Secret would hold
            placeholder = '["sk-x"]' if name == "FASTLLM_API_KEYS" else "sqlite:///x.db"
            monkeypatch.setenv(name, value if isinstance(value, str) else placeholder)
        settings = Settings()
        assert settings.host == "0.0.0.0" and settings.alerts_enabled is False
        assert settings.device == {"cpu": "cpu", "gpu": "cuda"}[overlay]


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_no_secret_is_a_literal(overlay: str) -> None:
    objects = k8s.render(overlay)
    for secret in k8s.of_kind(objects, "Secret"):
        assert not secret.get("data") and not secret.get("stringData"), secret["metadata"]
    for config in k8s.of_kind(objects, "ConfigMap"):
        assert not [k for k in config.get("data", {}) if SECRET_NAMES.search(k)]
    for deployment in _deployments(overlay):
        env = k8s.environment(objects, deployment)
        secret_like = {k: v for k, v in env.items() if SECRET_NAMES.search(k)}
        assert set(secret_like) == {
            "FASTLLM_API_KEYS",
            "FASTLLM_ADMIN_TOKEN",
            "FASTLLM_DATABASE_URL",
        }
        for name, value in secret_like.items():
            assert isinstance(value, dict) and "secretKeyRef" in value, name
            assert value["secretKeyRef"]["name"] == "fastllm-secrets"


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_grace_period_outlasts_prestop_and_drain(overlay: str) -> None:
    objects = k8s.render(overlay)
    for deployment in _deployments(overlay):
        spec = deployment["spec"]["template"]["spec"]
        env = k8s.environment(objects, deployment)
        command = k8s.runtime_container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
        assert command[0] == "sleep"
        needed = float(command[1]) + float(env["FASTLLM_DRAIN_UNREADY_S"])
        needed += float(env["FASTLLM_DRAIN_GRACE_S"])
        assert spec["terminationGracePeriodSeconds"] > needed


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_pods_run_non_root_read_only_with_weights_from_the_claim(overlay: str) -> None:
    objects = k8s.render(overlay)
    claims = {c["metadata"]["name"] for c in k8s.of_kind(objects, "PersistentVolumeClaim")}
    for deployment in _deployments(overlay):
        spec = deployment["spec"]["template"]["spec"]
        container = k8s.runtime_container(deployment)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        model_path = k8s.environment(objects, deployment)["FASTLLM_MODEL_PATH"]
        (mount,) = [m for p, m in mounts.items() if model_path.startswith(p + "/")]
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] in claims
        assert "/tmp" in mounts  # the root file system is read-only: scratch space is a volume


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_services_monitor_pdb_and_scaler_select_what_exists(overlay: str) -> None:
    objects = k8s.render(overlay)
    deployments = {d["metadata"]["name"]: d for d in _deployments(overlay)}
    services = {s["metadata"]["name"]: s for s in k8s.of_kind(objects, "Service")}
    assert set(services) == {"fastllm", "fastllm-canary"}
    for name, service in services.items():
        pods = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pods.items()
        others = [d for n, d in deployments.items() if n != name]
        for other in others:  # each Service reaches one track only
            labels = other["spec"]["template"]["metadata"]["labels"]
            assert not service["spec"]["selector"].items() <= labels.items()
        (port,) = service["spec"]["ports"]
        assert port["targetPort"] == k8s.runtime_container(deployments[name])["ports"][0]["name"]
        # the ServiceMonitor's job label is the Service name; the rules select job=~"fastllm.*"
        assert re.fullmatch("fastllm.*", name)
    (monitor,) = k8s.of_kind(objects, "ServiceMonitor")
    for service in services.values():
        assert (
            monitor["spec"]["selector"]["matchLabels"].items()
            <= service["metadata"]["labels"].items()
        )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] in _app_paths()
    (pdb,) = k8s.of_kind(objects, "PodDisruptionBudget")
    stable_pods = deployments["fastllm"]["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= stable_pods.items()
    (scaler,) = k8s.of_kind(objects, "ScaledObject")
    assert scaler["spec"]["scaleTargetRef"]["name"] == "fastllm"
    assert "replicas" not in deployments["fastllm"]["spec"]  # KEDA's HPA owns the count
    assert scaler["spec"]["minReplicaCount"] >= 2  # the PDB can then let one go
    for trigger in scaler["spec"]["triggers"]:
        names = selected_names(parse(trigger["metadata"]["query"]))
        assert names and names <= set(CONTRACT_METRIC_NAMES), names
        assert float(trigger["metadata"]["threshold"]) > 0


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_canary_is_a_second_deployment_weighted_by_the_httproute(overlay: str) -> None:
    objects = k8s.render(overlay)
    stable, canary = (k8s.named(objects, "Deployment", n) for n in ("fastllm", "fastllm-canary"))
    env_stable, env_canary = (k8s.environment(objects, d) for d in (stable, canary))
    assert env_canary["FASTLLM_MODEL_NAME"] == env_stable["FASTLLM_MODEL_NAME"]  # same name
    for key in ("FASTLLM_MODEL_VERSION", "FASTLLM_MODEL_PATH"):
        assert env_canary[key] != env_stable[key], key
    (route,) = k8s.of_kind(objects, "HTTPRoute")
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
    assert any(p.startswith("/v1/") for p in _app_paths())
    weights = {}
    for ref in rule["backendRefs"]:
        service = k8s.named(objects, "Service", ref["name"])
        assert ref["port"] in {p["port"] for p in service["spec"]["ports"]}
        weights[ref["name"]] = ref["weight"]
    assert 0 < weights["fastllm-canary"] < weights["fastllm"]


def test_only_the_gpu_overlay_asks_for_a_gpu() -> None:
    for overlay, wants_gpu in (("gpu", True), ("cpu", False)):
        for deployment in _deployments(overlay):
            resources = k8s.runtime_container(deployment)["resources"]
            assert ("nvidia.com/gpu" in resources.get("limits", {})) is wants_gpu, overlay
            assert resources["requests"]["memory"]
