"""`fastllm serve --speculative-method / --num-speculative-tokens`: a bad value is one line naming
the setting, exit 2, before any server is built; a self-draft in the served format is refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import runtime.server
from runtime.cli import main


@pytest.fixture
def serve(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    demo_model_dir: Callable[[str], Path],
) -> Callable[..., tuple[int, str]]:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the settings passed the startup checks: the server would start")

    monkeypatch.setattr(runtime.server, "create_app", never)
    monkeypatch.setattr(runtime.server, "run_server", never)
    model = str(demo_model_dir("llama"))

    def run(*flags: str) -> tuple[int, str]:
        with pytest.raises(SystemExit) as exc:
            main(["serve", "--model", model, "--port", "0", *flags])
        return int(exc.value.code or 0), capsys.readouterr().err

    return run


@pytest.mark.parametrize(
    ("flags", "setting"),
    [
        # the option's own bounds (click names the flag)
        (("--num-speculative-tokens", "0"), "--num-speculative-tokens"),
        (("--num-speculative-tokens", "17"), "--num-speculative-tokens"),
        (("--speculative-method", "eagle"), "speculative_method"),
        (("--speculative-method", "self_draft", "--quantization", "int4"), "draft"),
    ],
)
def test_bad_speculative_flags_are_one_line_and_exit_2(
    serve: Callable[..., tuple[int, str]], flags: tuple[str, ...], setting: str
) -> None:
    code, err = serve(*flags)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and setting in lines[0], err
    assert "Traceback" not in err
