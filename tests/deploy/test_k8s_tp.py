"""deploy/k8s/overlays/tp rendered by `kubectl kustomize`: a LeaderWorkerSet in the stable
Deployment's place. Built-in objects and both pod templates (as Pods) validate offline against
the Kubernetes schema (strict); the leader serves with tensor parallelism on and external
workers; the workers run the worker module with torch.distributed's variables taken from the
LWS ones; the group size is the setting; the Service selects leaders only; KEDA scales groups;
every FASTLLM_* variable is a real setting that parses."""

from __future__ import annotations

import importlib
from typing import Any

import kubernetes_validate
import pytest

from runtime.config import Settings
from tests.deploy import k8s

SCHEMA_VERSION = "1.30"


def _lws(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (lws,) = k8s.of_kind(objects, "LeaderWorkerSet")
    return lws


def _as_pod(template: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template["metadata"],
        **{"spec": template["spec"]},
    }


def test_tp_overlay_replaces_the_deployments_with_a_leader_worker_set() -> None:
    objects = k8s.render("tp")
    assert k8s.of_kind(objects, "Deployment") == []
    lws = _lws(objects)
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"} == {
        "fastllm"
    }
    for obj in objects:
        if k8s.is_builtin(obj):
            kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
    group = lws["spec"]["leaderWorkerTemplate"]
    for template in (group["leaderTemplate"], group["workerTemplate"]):
        kubernetes_validate.validate(_as_pod(template), SCHEMA_VERSION, strict=True)
    broken = _as_pod(group["workerTemplate"])
    broken["spec"]["containers"][0]["ports"] = [{"containerPort": "tp"}]
    with pytest.raises(kubernetes_validate.ValidationError):  # the check can fail
        kubernetes_validate.validate(broken, SCHEMA_VERSION, strict=True)


def test_leader_and_workers_form_one_group() -> None:
    objects = k8s.render("tp")
    group = _lws(objects)["spec"]["leaderWorkerTemplate"]
    configmaps = {o["metadata"]["name"]: o["data"] for o in k8s.of_kind(objects, "ConfigMap")}
    (leader,) = group["leaderTemplate"]["spec"]["containers"]
    (worker,) = group["workerTemplate"]["spec"]["containers"]
    settings = configmaps[leader["envFrom"][0]["configMapRef"]["name"]]
    assert worker["envFrom"][0]["configMapRef"]["name"] in configmaps
    assert int(settings["FASTLLM_TENSOR_PARALLEL_SIZE"]) == group["size"] == 2
    assert settings["FASTLLM_TENSOR_PARALLEL_SPAWN"] == "false"
    assert leader["args"] == ["serve"]
    port = settings["FASTLLM_TENSOR_PARALLEL_MASTER_PORT"]
    assert int(port) in [p["containerPort"] for p in leader["ports"]]
    assert worker["command"] == ["python", "-m", "runtime.engine.tp.worker"]
    assert callable(importlib.import_module("runtime.engine.tp.worker").main)
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env == {
        "MASTER_ADDR": "$(LWS_LEADER_ADDRESS)",
        "MASTER_PORT": port,
        "WORLD_SIZE": "$(LWS_GROUP_SIZE)",
        "RANK": "$(LWS_WORKER_INDEX)",
    }
    # every FASTLLM_* the leader sees is a setting and parses (a typo would be silently unused)
    leader_env = {**settings, **{e["name"]: e["value"] for e in leader["env"] if "value" in e}}
    fields = {f"FASTLLM_{name.upper()}" for name in Settings.model_fields}
    assert {k for k in leader_env if k.startswith("FASTLLM_")} <= fields
    values = {
        k[len("FASTLLM_") :].lower(): v for k, v in leader_env.items() if k.startswith("FASTLLM_")
    }
    parsed = Settings.model_validate(values)
    assert parsed.tensor_parallel_size == 2 and parsed.tensor_parallel_spawn is False


def test_service_selects_leaders_and_keda_scales_groups() -> None:
    objects = k8s.render("tp")
    group = _lws(objects)["spec"]["leaderWorkerTemplate"]
    service = k8s.named(objects, "Service", "fastllm")
    selector = service["spec"]["selector"].items()
    assert selector <= group["leaderTemplate"]["metadata"]["labels"].items()
    assert not selector <= group["workerTemplate"]["metadata"]["labels"].items()
    (scaled,) = k8s.of_kind(objects, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": "fastllm",
    }
