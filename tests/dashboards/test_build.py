"""The checked-in JSON is what the grafanalib sources render, and the CLI says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dashboards.build import GENERATED_DIR, SOURCE_DIR, build, check, sources
from runtime.cli import cli


def test_every_source_has_checked_in_json_that_is_up_to_date(tmp_path: Path) -> None:
    written = build(tmp_path)
    names = sorted(p.name for p in written)
    assert names == sorted(p.name.removesuffix(".dashboard.py") + ".json" for p in sources())
    assert names == sorted(p.name for p in GENERATED_DIR.glob("*.json"))
    for path in written:
        fresh = path.read_text()
        assert (GENERATED_DIR / path.name).read_text() == fresh, (
            f"{path.name} is stale: run `fastllm dashboards build`"
        )
        data = json.loads(fresh)
        assert data["uid"] == f"fastllm-{path.stem}"
        assert isinstance(data["schemaVersion"], int) and data["schemaVersion"] >= 36
    assert check() == []


def test_build_is_stable(tmp_path: Path) -> None:
    first = {p.name: p.read_text() for p in build(tmp_path / "a")}
    second = {p.name: p.read_text() for p in build(tmp_path / "b")}
    assert first == second
    for text in first.values():  # sorted keys at every level
        assert text == json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n"


def test_check_names_stale_missing_and_orphaned_files(tmp_path: Path) -> None:
    build(tmp_path)
    (tmp_path / "memory.json").write_text("{}\n")
    (tmp_path / "overview.json").unlink()
    (tmp_path / "old.json").write_text("{}\n")
    problems = check(tmp_path)
    assert len(problems) == 3
    assert any("memory.json" in p and "stale" in p for p in problems)
    assert any("overview.json" in p and "missing" in p for p in problems)
    assert any("old.json" in p for p in problems)
    build(tmp_path)  # rebuilding fixes all three (and removes the orphan)
    assert check(tmp_path) == []
    assert not (tmp_path / "old.json").exists()


@pytest.mark.parametrize("stale", [False, True])
def test_cli_check_exit_code(tmp_path: Path, stale: bool) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["dashboards", "build", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output
    if stale:
        path = tmp_path / "batching.json"
        path.write_text(path.read_text().replace("Batching", "Batch"))
    result = runner.invoke(cli, ["dashboards", "check", "--out", str(tmp_path)])
    if stale:
        assert result.exit_code == 1
        assert "batching.json" in result.output and "stale" in result.output
    else:
        assert result.exit_code == 0, result.output


def test_cli_check_of_the_repository_passes() -> None:
    result = CliRunner().invoke(cli, ["dashboards", "check", "--source", str(SOURCE_DIR)])
    assert result.exit_code == 0, result.output
