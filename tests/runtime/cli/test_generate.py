"""`fastllm generate` / `make-demo-model`: stdout holds the completion only; errors are one line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from runtime.cli import cli, main
from runtime.engine.offline import generate
from runtime.engine.sampling import SamplingParams
from runtime.models.loader import load_model


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_generate_prints_only_the_completion(
    demo_model_dir: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = demo_model_dir("llama")
    rc, out, _ = _main(["generate", "--model", str(path), "--max-tokens", "8", "The cache"], capsys)
    expected = generate(
        load_model(path), ["The cache"], SamplingParams(max_tokens=8, temperature=0)
    )
    assert rc == 0
    assert out == expected[0].text + "\n"


def test_generate_seeded_sampling_is_repeatable(demo_model_dir: Callable[[str], Path]) -> None:
    args = ["generate", "--model", str(demo_model_dir("llama")), "--max-tokens", "10"]
    args += ["--temperature", "0.9", "--top-p", "0.95", "--seed", "5", "Hello"]
    runner = CliRunner()
    first, second = runner.invoke(cli, args), runner.invoke(cli, args)
    assert first.exit_code == 0 and first.output == second.output


@pytest.mark.parametrize(
    ("argv_tail", "message"),
    [
        (["--model", "/nonexistent/model", "hi"], "does not exist"),
        (["--model", "{model}", "--top-p", "2", "hi"], "--top-p"),  # refused by the option type
        (["--model", "{model}", "--max-tokens", "4", "{long}"], "context"),
        (["--model", "{bad_config}", "hi"], "config.json"),
    ],
)
def test_generate_errors_are_one_line(
    argv_tail: list[str],
    message: str,
    demo_model_dir: Callable[[str], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{broken")
    subs = {
        "{model}": str(demo_model_dir("llama")),
        "{bad_config}": str(bad),
        "{long}": "a " * 3000,
    }
    argv = ["generate", *[subs.get(a, a) for a in argv_tail]]
    rc, out, err = _main(argv, capsys)
    assert rc == 2 and out == ""
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_cli_subprocess_has_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", "generate", "--model", str(tmp_path / "nope"), "hi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


@pytest.mark.parametrize("verb", ["generate", "embed", "make-demo-model"])
def test_help_has_an_example(verb: str) -> None:
    result = CliRunner().invoke(cli, [verb, "--help"])
    assert result.exit_code == 0 and f"fastllm {verb} " in result.output


def test_make_demo_model_then_generate(tmp_path: Path) -> None:
    runner = CliRunner()
    made = runner.invoke(
        cli, ["make-demo-model", str(tmp_path / "m"), "--arch", "gemma", "--seed", "3"]
    )
    assert made.exit_code == 0, made.output
    assert json.loads((tmp_path / "m" / "config.json").read_text())["architectures"] == [
        "GemmaForCausalLM"
    ]
    out = runner.invoke(cli, ["generate", "--model", str(tmp_path / "m"), "--max-tokens", "3", "x"])
    assert out.exit_code == 0
