"""`fastllm doctor`: the troubleshooting checklist, each item a pass / fail / skip with the fix.

    results = run_checks(DoctorOptions(model_path=Path("demo-models/llama-tiny")))
    failed = [r for r in results if r.status == FAIL]

Checks: torch / CUDA versions; an operator self-test of every fast op on the device; the model
loads; a GeGLU checkpoint converted from a legacy file without --fix-geglu (its metadata says so);
tokenizer round trip and input ranges; the model generates (split over its ranks under tensor
parallelism, against the reference path: doctor_tp.py); database reachable and migrated; an
optional /metrics scrape parses. A check that cannot run because an earlier one failed is skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from runtime.errors import FastllmError
from runtime.tools.doctor_model import check_model
from runtime.tools.doctor_ops import self_test_ops
from runtime.tools.doctor_report import (
    FAIL,
    PASS,
    SKIP,
    CheckResult,
    DoctorOptions,
    failed,
    passed,
)

__all__ = ["FAIL", "PASS", "SKIP", "CheckResult", "DoctorOptions", "run_checks"]

MIN_CUDA = (11, 6)


def check_versions(device: torch.device) -> CheckResult:
    name = "torch / CUDA versions"
    detail = f"torch {torch.__version__}"
    if device.type != "cuda":
        return passed(name, f"{detail}, running on {device}")
    cuda = torch.version.cuda
    if cuda is None:
        return failed(name, f"{detail} has no CUDA support", "install a CUDA build of torch")
    version = tuple(int(p) for p in cuda.split(".")[:2])
    if version < MIN_CUDA:
        return failed(
            name,
            f"{detail} built for CUDA {cuda} (< 11.6)",
            "install a torch build for CUDA >= 11.6 and a driver that supports it",
        )
    gpu = torch.cuda.get_device_name(device)
    return passed(name, f"{detail}, CUDA {cuda}, {gpu}")


def check_ops(device: torch.device) -> list[CheckResult]:
    results = []
    for check in self_test_ops(device):
        detail = f"max |op - ref| {check.max_abs_error:.2e} (tolerance {check.tolerance:.0e})"
        if check.is_ok:
            results.append(passed(f"op {check.name}", detail))
        else:
            fix = (
                f"the fast `{check.op}` kernel disagrees with its reference on {device}: check "
                "the torch/CUDA build and driver, or serve with --device cpu until fixed"
            )
            results.append(failed(f"op {check.name}", detail, fix))
    return results


def run_checks(options: DoctorOptions) -> list[CheckResult]:
    from runtime.models.loader import resolve_device

    device = resolve_device(options.device)
    results = [check_versions(device), *check_ops(device)]
    if options.model_path is not None and options.tensor_parallel_size > 1:
        from runtime.tools.doctor_tp import check_sharded

        results += check_sharded(options, device)
    elif options.model_path is not None:
        results += check_model(options, device)
    if options.database_url is not None:
        results.append(_guarded("database", lambda: check_database(options.database_url or "")))
    if options.metrics_url is not None:
        results.append(_guarded("metrics scrape", lambda: check_metrics(options.metrics_url or "")))
    return results


def _guarded(name: str, check: Callable[[], CheckResult]) -> CheckResult:
    try:
        return check()
    except FastllmError as exc:
        return failed(name, exc.message, "see the message")


def check_database(url: str) -> CheckResult:
    from sqlalchemy import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from storage.db import current_revision, head_revision, make_engine

    name = "database reachable and migrated"
    upgrade = f"fastllm db upgrade --database-url '{url}' (serve also migrates on start)"
    parsed = make_url(url)
    file = parsed.database if parsed.get_backend_name() == "sqlite" else None
    if file not in (None, "", ":memory:") and not Path(str(file)).expanduser().is_file():
        # connecting would create an empty file: report it instead
        return failed(name, f"SQLite file {file} does not exist", upgrade)
    engine = make_engine(url)
    try:
        current = current_revision(engine)
    except SQLAlchemyError as exc:
        reason = str(exc).splitlines()[0]
        fix = "start the database, check database_url (host, port, user, password)"
        return failed(name, f"cannot connect: {reason}", fix)
    finally:
        engine.dispose()
    head = head_revision()
    shown = parsed.render_as_string(hide_password=True)
    if current != head:
        return failed(name, f"{shown} at revision {current}, code expects {head}", upgrade)
    return passed(name, f"{shown} at revision {head}")


def check_metrics(url: str) -> CheckResult:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    name = "metrics scrape parses"
    try:
        response = httpx.get(url, timeout=5.0)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        return failed(name, f"GET {url}: {exc}", "is the server running? check --metrics-url")
    try:
        families: list[Any] = list(text_string_to_metric_families(response.text))
    except Exception as exc:  # the parser raises ValueError and friends
        return failed(
            name, f"{url} is not Prometheus text: {exc}", "point --metrics-url at /metrics"
        )
    ours = [f.name for f in families if f.name.startswith("fastllm_")]
    if not ours:
        return failed(name, f"{url} has no fastllm_* metrics", "point --metrics-url at a runtime")
    fell_back = [
        sample.labels.get("model", "?")
        for family in families
        if family.name == "fastllm_compile_fallbacks"
        for sample in family.samples
        if sample.value > 0
    ]
    if fell_back:
        detail = (
            f"the compiled decode step fell back to the eager forward for {', '.join(fell_back)} "
            "(fastllm_compile_fallbacks = 1; the reason is the server log's 'compiled decode "
            "step failed' line, or this doctor's fast-path check with --model)"
        )
        fix = "inductor needs a C++ compiler and a writable compile_cache_dir; or --compile off"
        return failed(name, detail, fix)
    return passed(name, f"{len(families)} families, {len(ours)} fastllm_*")
