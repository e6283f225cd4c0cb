"""`fastllm doctor --tensor-parallel-size N`: the model checked split over N ranks (gloo, CPU
worker processes), its generation against the reference path that gathers the other ranks'
layers; sizes that do not divide fail in one line before any worker starts; a bad value on the
command line is exit 2."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from runtime.tools.doctor import FAIL, PASS, SKIP, DoctorOptions, run_checks
from tests.runtime.tools.test_doctor import _doctor


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # rank 0 beside its worker on a shared 2-core machine


def _status(results: list) -> dict[str, tuple[str, str]]:
    return {r.name: (r.status, r.detail) for r in results}


def test_doctor_checks_the_split_model(demo_model_dir: Callable[[str], Path]) -> None:
    options = DoctorOptions(
        model_path=demo_model_dir("llama"), device="cpu", tensor_parallel_size=2
    )
    status = _status(run_checks(options))
    assert status["model loads sharded (2 ranks)"][0] == PASS
    assert status["tokenizer round trip and ranges"][0] == PASS
    verdict, detail = status["sharded generation vs gathered reference"]
    assert verdict == PASS, detail
    assert "2 requests, max |logit - reference|" in detail
    assert [name for name, (s, _) in status.items() if s == FAIL] == []


def test_doctor_sizes_that_do_not_divide(demo_model_dir: Callable[[str], Path]) -> None:
    options = DoctorOptions(
        model_path=demo_model_dir("llama"), device="cpu", tensor_parallel_size=3
    )
    results = run_checks(options)
    status = _status(results)
    assert status["model loads sharded (3 ranks)"] == (
        FAIL,
        "tensor_parallel_size 3 does not divide the model's 4 attention heads",
    )
    assert status["sharded generation vs gathered reference"][0] == SKIP
    assert "divides" in next(r.fix for r in results if r.status == FAIL)


def test_cli_refuses_a_bad_size(capsys: pytest.CaptureFixture[str]) -> None:
    rc, text = _doctor(["--no-model", "--no-db", "--tensor-parallel-size", "0"], capsys)
    assert rc == 2 and "--tensor-parallel-size" in text
