"""Issue 29, item 4: every verb given hostile arguments (NaN, huge, missing, traversing paths,
malformed YAML, an unknown revision) ends in one line naming the option, setting or file, and
exit 2; no traceback (an exception escaping `main` fails the test). In-process: `main` is the
console entry point, so what it prints is what a user sees."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest

from runtime.cli import VERBS, cli, main
from runtime.cli.params import Bounded, Finite


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    err = capsys.readouterr().err
    return int(exc.value.code or 0), [line for line in err.splitlines() if line.strip()]


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "bad.yaml").write_text("a: [1\n")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    return tmp_path


def _db(tmp_path: Path, revision: str | None = None) -> str:
    path = tmp_path / "x.db"
    if revision is not None:  # a database stamped by a version of fastllm this one does not know
        with sqlite3.connect(path) as con:
            con.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
            con.execute("INSERT INTO alembic_version VALUES (?)", (revision,))
    return f"sqlite:///{path}"


# (argv with {tmp} and {model} placeholders, what the one line must name)
CASES: list[tuple[list[str], str]] = [
    (["audit", "--threshold", "nan", "--database-url", "{db}"], "--threshold"),
    (["audit", "--threshold", "inf", "--database-url", "{db}"], "--threshold"),
    (["audit", "--threshold", "-1", "--database-url", "{db}"], "--threshold"),
    (["audit", "--since", "800000d", "--database-url", "{db}"], "--since"),
    (["audit", "--since", "1e400d", "--database-url", "{db}"], "--since"),
    (["audit", "--limit", "9" * 400, "--database-url", "{db}"], "--limit"),
    (["db", "upgrade", "--revision", "zzz", "--database-url", "{db}"], "zzz"),
    (["db", "prune", "--retention-days", "nan", "--database-url", "{db}"], "--retention-days"),
    (["db", "prune", "--batch-size", "0", "--database-url", "{db}"], "--batch-size"),
    (["serve", "--config", "{tmp}/bad.yaml", "--model", "{model}"], "bad.yaml"),
    (["serve", "--config", "{tmp}/list.yaml", "--model", "{model}"], "list.yaml"),
    (["serve", "--config", "{tmp}/missing.yaml", "--model", "{model}"], "missing.yaml"),
    (["serve", "--port", "70000", "--model", "{model}"], "--port"),
    (["serve", "--port", "nan", "--model", "{model}"], "--port"),
    (["generate", "--model", "{model}", "--temperature", "nan", "hi"], "--temperature"),
    (["generate", "--model", "{model}", "--top-p", "inf", "hi"], "--top-p"),
    (["generate", "--model", "{model}", "--max-tokens", "9" * 40, "hi"], "--max-tokens"),
    (["generate", "--model", "{model}", "--seed", "-1", "hi"], "--seed"),
    (["generate", "--model", "{tmp}/nowhere", "hi"], "nowhere"),
    (["convert", "--input", "{tmp}/nowhere", "--output", "{tmp}/out"], "nowhere"),
    (["convert", "--input", "{model}", "--output", "/proc/1/nope"], "/proc/1/nope"),
    (["alerts", "run", "--metrics-url", "http://127.0.0.1:9/m", "--interval", "nan"], "--interval"),
    (["alerts", "run", "--metrics-url", "http://x/m", "--time-scale", "-inf"], "--time-scale"),
    (["alerts", "run", "--metrics-url", "http://x/m", "--rounds", "9" * 400], "--rounds"),
    (["rollout", "set", "--weight", "nan", "--url", "http://127.0.0.1:9"], "--weight"),
    (["make-demo-model", "{tmp}/demo", "--seed", "9" * 400], "--seed"),
    (["embed", "--model", "{tmp}/nowhere", "hi"], "nowhere"),
]


@pytest.mark.parametrize(
    ("argv", "named"), CASES, ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else v
)
def test_one_line_naming_it_and_exit_2(
    capsys: pytest.CaptureFixture[str],
    files: Path,
    demo_model_dir: Callable[[str], Path],
    argv: list[str],
    named: str,
) -> None:
    values = {"tmp": str(files), "model": str(demo_model_dir("llama")), "db": _db(files)}
    code, lines = run(capsys, *(a.format(**values) for a in argv))
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert named in lines[0], lines


def test_an_unknown_alembic_version_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, lines = run(capsys, "db", "upgrade", "--database-url", _db(tmp_path, "deadbeef"))
    assert code == 2 and len(lines) == 1, lines
    assert "deadbeef" in lines[0] and "revision" in lines[0]


def _commands(group: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
    yield path, group
    if isinstance(group, click.Group):
        for name, sub in group.commands.items():
            yield from _commands(sub, f"{path} {name}")


def test_every_numeric_option_refuses_nan_inf_and_has_bounds() -> None:
    ctx = click.Context(cli)
    loose = []
    for verb in VERBS:
        command = cli.get_command(ctx, verb)
        assert command is not None
        for path, sub in _commands(command, verb):
            for param in sub.params:
                numeric = isinstance(
                    param.type, (click.types.FloatParamType, click.types.IntParamType)
                )
                if numeric and not isinstance(param.type, (Finite, Bounded)):
                    loose.append(f"{path} {param.name}")
    assert loose == []
