"""bench.attacks' cheapest parts, so the script cannot rot: one short attack phase against a live
server with its rows counted, and the verification part on the tiny demo llama (the script runs
it on SmolLM2). No timing is asserted: the bounds are the script's output, not the test's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bench import attacks
from bench.attacks_verify import verify_one
from bench.event_loop import expected_rows
from runtime.models.quant import Int8Linear


def test_rows_owed_follow_the_row_policy() -> None:
    batch = {"prompt": [[5, 6], [7, 8], [9]]}
    assert expected_rows("/v1/completions", batch, "200") == 3  # one per prompt
    assert expected_rows("/v1/completions", batch, "400") == 1  # a refusal: one
    assert expected_rows("/v1/completions", {"prompt": [5, 6, 7]}, "200") == 1  # one prompt of ids
    assert expected_rows("/v1/chat/completions", {"messages": []}, "hang") == 1
    assert expected_rows("/tokenize", {"prompt": "x"}, "200") == 0


def test_one_phase_against_a_live_server_logs_one_row_per_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    label = "never fits (512 seqs)"
    attacks.main(["--seconds", "1", "--only", label, "--skip-verify"])
    out = capsys.readouterr().out
    (statuses,) = [line for line in out.splitlines() if line.startswith(f"  {label}: ")]
    assert "'/v1/completions 400'" in statuses  # refused at once: a 400, never a 200
    assert "'/v1/completions 200'" not in statuses
    assert "PASS  rows 1 per request: yes" in out
    assert "PASS  0 5xx" in out
    assert "PASS  0 hangs" in out


def test_the_verification_part_finds_no_anomaly_and_catches_the_corrupted_kernel(
    demo_model_dir: Callable[[str], Path],
) -> None:
    intact = Int8Linear.forward
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    row = verify_one(demo_model_dir("llama"), "int8", "int8", False, prompts, prompts)
    assert row.verified > 0
    assert row.anomalies == 0
    assert row.caught > 0
    assert row.kernel == "Int8Linear.forward"
    assert Int8Linear.forward is intact  # restored after the corrupted run
