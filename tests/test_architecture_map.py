"""docs/architecture.md's generated parts stay true to the code: the package map is what
`tools.architecture` makes from the modules' docstrings now (so a module added, removed or
re-summarised without `python -m tools.architecture --write` fails here); the generator and the
request-path recorder do what they say on a small tree of their own."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch

from runtime.errors import ConfigError
from runtime.models import ops
from tools import architecture
from tools.request_path import CallRecorder, profiled


def test_the_package_map_in_the_docs_is_the_generated_one() -> None:
    text = architecture.DOC.read_text(encoding="utf-8")
    assert architecture.current_block(text, architecture.MAP) == architecture.package_map(), (
        "docs/architecture.md's package map is stale: run `python -m tools.architecture --write`"
    )
    assert architecture.main(["--check"]) == 0


def test_the_map_lists_every_module_with_its_docstring_line(tmp_path: Path) -> None:
    pkg = tmp_path / "runtime"
    (pkg / "engine" / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""The runtime.\n\nMore."""\n')
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "engine" / "core.py").write_text('"""The step loop.\nsecond line"""\nX = 1\n')
    (pkg / "bare.py").write_text("X = 1\n")
    long = "word " * 40
    (pkg / "wordy.py").write_text(f'"""{long}"""\n')
    for other in architecture.PACKAGES[1:]:
        (tmp_path / other).mkdir()
    lines = architecture.package_map(tmp_path).splitlines()
    assert lines[0] == lines[-1] == "```"
    assert lines[1].split() == ["runtime/", "The", "runtime."]
    assert lines[2] == "  bare.py"  # no docstring: the name alone
    assert lines[3].startswith("  wordy.py ") and len(lines[3]) <= architecture.WIDTH
    assert lines[3].endswith("…")
    assert lines[4] == "  engine/"
    assert lines[5].split() == ["core.py", "The", "step", "loop."]


def test_a_stale_map_fails_the_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    doc = tmp_path / "architecture.md"
    begin, end = architecture._markers(architecture.MAP)
    doc.write_text(f"# A\n\n{begin}\n```\nruntime/  old\n```\n{end}\n\nprose\n")
    monkeypatch.setattr(architecture, "DOC", doc)
    monkeypatch.setattr(architecture, "ROOT", tmp_path)
    assert architecture.main(["--check"]) == 1
    assert architecture.main(["--write", "--map-only"]) == 0
    assert architecture.main(["--check"]) == 0
    text = doc.read_text()
    assert text.startswith("# A\n\n") and text.endswith(f"{end}\n\nprose\n")


def test_the_recorder_keeps_project_files_on_request_threads() -> None:
    recorder = CallRecorder(Path(architecture.__file__).resolve().parent.parent)

    def engine_step() -> None:
        architecture.summary(Path(architecture.__file__))  # tools/: not the project's path
        ops.swiglu(torch.ones(1), torch.ones(1))

    def writer() -> None:
        ConfigError("a background thread's call", param="x")

    with profiled(recorder):
        ops.geglu(torch.ones(1), torch.ones(1))  # before recording: not counted
        recorder.recording = True
        for name, target in (("fastllm-engine", engine_step), ("inference-log", writer)):
            thread = threading.Thread(target=target, name=name)
            thread.start()
            thread.join()
        recorder.recording = False
        ops.geglu(torch.ones(1), torch.ones(1))
    assert sys.getprofile() is None
    assert recorder.files == {
        "fastllm-engine": {"runtime/models/ops.py"},
        "inference-log": {"runtime/errors.py"},
    }
    assert recorder.on_path() == ["runtime/models/ops.py"]  # the writer's thread not counted
