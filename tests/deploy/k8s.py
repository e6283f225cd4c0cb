"""deploy/k8s rendered by the real `kubectl kustomize` (once per overlay), and lookups into the
rendered objects."""

from __future__ import annotations

import functools
import subprocess
from typing import Any

import yaml

from tests.conftest import require_binary
from tests.deploy.stack import REPO

K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu")
BUILTIN_GROUPS = ("v1", "apps/", "policy/")  # apiVersions kubernetes-validate has schemas for


@functools.cache
def _render(overlay: str, kubectl: str) -> tuple[dict[str, Any], ...]:
    done = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def render(overlay: str) -> list[dict[str, Any]]:
    """Every object of the overlay (skips without kubectl; fails in CI)."""
    return list(_render(overlay, require_binary("kubectl")))


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    return found


def is_builtin(obj: dict[str, Any]) -> bool:
    version = obj["apiVersion"]
    return version == "v1" or version.startswith(BUILTIN_GROUPS[1:])


def runtime_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "runtime"
    ]
    return container


def settings_configmap(objects: list[dict[str, Any]], deployment: dict[str, Any]) -> dict[str, str]:
    """The data of the ConfigMap the runtime container takes its environment from."""
    (ref,) = runtime_container(deployment)["envFrom"]
    data: dict[str, str] = named(objects, "ConfigMap", ref["configMapRef"]["name"])["data"]
    return data


def environment(objects: list[dict[str, Any]], deployment: dict[str, Any]) -> dict[str, Any]:
    """Variable -> value (a literal, or the `valueFrom` mapping), as the container sees it:
    the ConfigMap's first, `env` entries over them."""
    env: dict[str, Any] = dict(settings_configmap(objects, deployment))
    for entry in runtime_container(deployment).get("env", []):
        env[entry["name"]] = entry.get("value", entry.get("valueFrom"))
    return env
