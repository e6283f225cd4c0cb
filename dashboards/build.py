"""Dashboards as code: each `dashboards/<name>.dashboard.py` defines a grafanalib `dashboard`;
`build()` renders them to `dashboards/generated/<name>.json` (sorted keys, 2-space indent, one
trailing newline, so the output is byte-stable) and `check()` names the checked-in files that
differ from a fresh render. `fastllm dashboards build|check` wraps both.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from grafanalib._gen import DashboardEncoder

SOURCE_DIR = Path(__file__).resolve().parent
GENERATED_DIR = SOURCE_DIR / "generated"
SUFFIX = ".dashboard.py"


class DashboardBuildError(RuntimeError):
    pass


def sources(source_dir: Path = SOURCE_DIR) -> list[Path]:
    return sorted(source_dir.glob(f"*{SUFFIX}"))


def load(path: Path) -> Any:
    """The `dashboard` object a `*.dashboard.py` file defines (file names with dots are not
    importable as modules, so each is executed from its path)."""
    name = path.name.removesuffix(SUFFIX)
    spec = importlib.util.spec_from_file_location(f"dashboards._src_{name}", path)
    if spec is None or spec.loader is None:
        raise DashboardBuildError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "dashboard"):
        raise DashboardBuildError(f"{path} defines no `dashboard`")
    return module.dashboard


def render(path: Path) -> str:
    data = json.loads(json.dumps(load(path).to_json_data(), cls=DashboardEncoder))
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def render_all(source_dir: Path = SOURCE_DIR) -> dict[str, str]:
    """File name (`<name>.json`) -> JSON text, for every source."""
    found = sources(source_dir)
    if not found:
        raise DashboardBuildError(f"no *{SUFFIX} files in {source_dir}")
    return {f"{p.name.removesuffix(SUFFIX)}.json": render(p) for p in found}


def build(out_dir: Path = GENERATED_DIR, source_dir: Path = SOURCE_DIR) -> list[Path]:
    """Write every dashboard's JSON into `out_dir`; returns the written paths. JSON files there
    without a source are removed, so a deleted dashboard does not linger in Grafana."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rendered = render_all(source_dir)
    for stale in out_dir.glob("*.json"):
        if stale.name not in rendered:
            stale.unlink()
    written = []
    for name, text in rendered.items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def check(out_dir: Path = GENERATED_DIR, source_dir: Path = SOURCE_DIR) -> list[str]:
    """Problems with the checked-in JSON (empty = up to date): missing, stale or orphaned files,
    each naming the file."""
    rendered = render_all(source_dir)
    problems = []
    for name, text in rendered.items():
        path = out_dir / name
        if not path.exists():
            problems.append(f"{path}: missing (run `fastllm dashboards build`)")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path}: stale (run `fastllm dashboards build`)")
    for path in sorted(out_dir.glob("*.json")):
        if path.name not in rendered:
            problems.append(f"{path}: no {path.stem}{SUFFIX} source (delete it or rebuild)")
    return problems
