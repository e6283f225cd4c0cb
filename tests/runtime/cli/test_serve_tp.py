"""`fastllm serve --tensor-parallel-size N` with an N that does not divide the model: one line
naming the setting, exit 2, before any worker process starts or the server is built."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import runtime.server
from runtime.cli import main


def test_bad_tensor_parallel_size_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    demo_model_dir: Callable[[str], Path],
) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the settings passed the startup checks: the server would start")

    monkeypatch.setattr(runtime.server, "create_app", never)
    monkeypatch.setattr(runtime.server, "run_server", never)
    model = str(demo_model_dir("llama"))  # 4 heads
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--model", model, "--port", "0", "--tensor-parallel-size", "3"])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert err.count("\n") == 1, err
    assert "tensor_parallel_size 3 does not divide the model's 4 attention heads" in err
    assert "Traceback" not in err
