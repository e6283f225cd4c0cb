"""What every doctor check returns, and the options they read (shared by doctor.py and
doctor_model.py, so neither imports the other's module for them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PASS, FAIL, SKIP = "pass", "fail", "skip"
ROUND_TRIP_TEXT = "Hello, world! The KV cache holds 1024 tokens; naïve café ünïcode."


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str  # PASS | FAIL | SKIP
    detail: str
    fix: str = ""  # what to do about a failure


@dataclass(frozen=True)
class DoctorOptions:
    model_path: Path | None = None  # None: no model checks
    device: str = "auto"
    dtype: str = "float32"
    legacy_support: bool = False
    quantization: str = "none"  # int8 | int4 | fp8 at load (a quantized checkpoint is as stored)
    database_url: str | None = None  # None: no database check
    metrics_url: str | None = None  # None: no scrape check
    compile: str = "auto"  # the fast-path check builds what `serve` would (settings.compile)
    compile_cache_dir: Path | None = None  # settings.compile_cache_dir
    # > 1: the model is checked split over that many ranks, as `serve` runs it (doctor_tp.py)
    tensor_parallel_size: int = 1


def passed(name: str, detail: str) -> CheckResult:
    return CheckResult(name, PASS, detail)


def failed(name: str, detail: str, fix: str) -> CheckResult:
    return CheckResult(name, FAIL, detail, fix)
