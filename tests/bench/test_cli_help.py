"""Every bench with a command line parses it: `--help` answers and exits 0 (a merge once gave
bench.soak two `--model` options, which argparse refuses only when the parser is built)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
MAINS = sorted(p.stem for p in BENCH.glob("*.py") if "\ndef main(" in p.read_text())


def test_the_benches_with_a_main_are_found() -> None:
    assert {"soak", "serving", "quant", "batching"} <= set(MAINS)


@pytest.mark.parametrize("name", MAINS)
def test_help_parses(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    module = importlib.import_module(f"bench.{name}")
    monkeypatch.setattr("sys.argv", [f"bench.{name}", "--help"])  # some mains read sys.argv
    with pytest.raises(SystemExit) as exc:
        module.main()
    assert exc.value.code == 0
    assert "usage:" in capsys.readouterr().out
