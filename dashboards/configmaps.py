"""dashboards/generated/*.json as Grafana dashboard ConfigMaps for Kubernetes
(deploy/k8s/base/grafana-dashboards.yaml): one ConfigMap per dashboard, labelled
`grafana_dashboard: "1"` for Grafana's sidecar, the JSON text unchanged.
`fastllm dashboards export --format configmap` writes it; `--check` names a stale file.

One ConfigMap each keeps every object well under the 256 KiB that `kubectl apply` may store in
its last-applied annotation. The JSON goes in as a YAML block scalar: byte-stable and diffable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dashboards.build import GENERATED_DIR, DashboardBuildError

HEADER = (
    "# Generated from dashboards/generated/*.json by `fastllm dashboards export --format\n"
    "# configmap`; do not edit (tests/deploy/ fail when it is stale).\n"
)
FOLDER = "fastllm"  # k8s-sidecar's folder annotation (kube-prometheus-stack: grafana_folder)


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings as `|` blocks; everything else as safe_dump does."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def configmap(path: Path) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"fastllm-dashboard-{path.stem}",
            "labels": {"app.kubernetes.io/name": "fastllm", "grafana_dashboard": "1"},
            "annotations": {"grafana_folder": FOLDER},
        },
        "data": {path.name: path.read_text(encoding="utf-8")},
    }


def configmaps(generated_dir: Path = GENERATED_DIR) -> str:
    paths = sorted(generated_dir.glob("*.json"))
    if not paths:
        hint = "run `fastllm dashboards build`"
        raise DashboardBuildError(f"no dashboards in {generated_dir} ({hint})")
    documents = [configmap(p) for p in paths]
    return HEADER + yaml.dump_all(documents, Dumper=_BlockDumper, sort_keys=False, width=100)


def check(path: Path, generated_dir: Path = GENERATED_DIR) -> list[str]:
    """Problems with `path` (empty: up to date)."""
    hint = f"run `fastllm dashboards export --format configmap --out {path}`"
    if not path.exists():
        return [f"{path}: missing ({hint})"]
    try:
        fresh = configmaps(generated_dir)
    except DashboardBuildError as exc:
        return [str(exc)]
    if path.read_text(encoding="utf-8") != fresh:
        return [f"{path}: stale ({hint})"]
    return []
