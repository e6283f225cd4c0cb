"""A plain chat request pays for no optional feature: `tools.request_path` measures the project
files one non-streaming chat request (one choice, no logprobs, sampling controls, constraint or
tools) runs through on a served app (files whose code runs for it, a dataclass's generated
`__init__` included). None of the API's or the engine's feature modules is among them (each runs
only behind its request's flag), no sink runs on the request's threads (they run on the engine's
stats thread), and the whole path stays within issue 36's bound.
"""

from __future__ import annotations

import fnmatch
import threading

import pytest

from runtime.server.openai.features import Features
from tools.request_path import ROOT, CallRecorder, measure, profiled

MAX_FILES = 45  # issue 36: 65 files when it was filed, 55 before the sinks left the loop

# the API's modules of optional features (runtime.server.openai's docstring says what each does)
FEATURE_MODULES = (
    "runtime/server/openai/logprobs.py",
    "runtime/server/openai/choice_logprobs.py",
    "runtime/server/openai/controls.py",
    "runtime/server/openai/structured.py",
    "runtime/server/openai/choices.py",
    "runtime/server/openai/unsupported.py",
    "runtime/server/openai/tools/*",
    "runtime/server/anthropic/*",
    "*batched*",
)
# the engine's: a sequence's feature state, choices, constraints, logprobs, logits processors
ENGINE_FEATURE_MODULES = (
    "runtime/engine/features.py",
    "runtime/engine/choices.py",
    "runtime/engine/choice_group.py",
    "runtime/engine/logprobs.py",
    "runtime/engine/grammar_wait.py",
    "runtime/engine/constraints/*",
    "runtime/engine/logits/*",
    "runtime/engine/sampling/bias.py",
    "runtime/engine/sampling/min_tokens.py",
    "runtime/engine/sampling/penalties.py",
    "runtime/engine/sampling/processors.py",
)
# what consumes the engine's numbers: the sinks, the batch policy's model, the allocator's report
SINK_MODULES = (
    "monitoring/*",
    "storage/*",
    "runtime/serving/rollout*",
    "runtime/engine/batching/*",
    "runtime/memory/allocator.py",
    "runtime/memory/ledger.py",
)


def _matching(files: list[str], patterns: tuple[str, ...]) -> list[str]:
    return [f for f in files if any(fnmatch.fnmatch(f, p) for p in patterns)]


@pytest.mark.slow
def test_a_plain_chat_request_runs_no_feature_module_no_sink_and_few_files() -> None:
    files = measure()
    assert "runtime/server/openai/routes.py" in files  # the recorder saw the handler
    assert "runtime/engine/model_runner.py" in files  # ... and the engine thread
    assert "runtime/server/openai/features.py" in files  # its one dataclass's __init__ counts
    on_path = _matching(files, FEATURE_MODULES + ENGINE_FEATURE_MODULES)
    assert on_path == [], f"feature modules on a plain chat request's path: {on_path}"
    sinks = _matching(files, SINK_MODULES)
    assert sinks == [], f"sinks on a plain chat request's path: {sinks}"
    assert len(files) <= MAX_FILES, files


def test_a_dataclass_built_counts_for_its_module() -> None:
    recorder = CallRecorder(ROOT)
    with profiled(recorder):
        recorder.recording = True
        Features(False, False, False, False, False)  # only its generated __init__ runs
        recorder.recording = False
    assert recorder.files[threading.current_thread().name] == {"runtime/server/openai/features.py"}
