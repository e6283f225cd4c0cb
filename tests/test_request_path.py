"""A plain chat request pays for no optional feature: `tools.request_path` measures the project
files one non-streaming chat request (one choice, no logprobs, sampling controls, constraint or
tools) runs through on a served app, and none of the API's feature modules is among them
(runtime.server.openai.features: each runs only behind its body's flag)."""

from __future__ import annotations

import fnmatch

import pytest

from tools.request_path import measure

# the API's modules of optional features (runtime.server.openai's docstring says what each does)
FEATURE_MODULES = (
    "runtime/server/openai/logprobs.py",
    "runtime/server/openai/choice_logprobs.py",
    "runtime/server/openai/controls.py",
    "runtime/server/openai/structured.py",
    "runtime/server/openai/choices.py",
    "runtime/server/openai/tools/*",
    "*batched*",
)


@pytest.mark.slow
def test_no_feature_module_is_on_a_plain_chat_requests_path() -> None:
    files = measure()
    assert "runtime/server/openai/routes.py" in files  # the recorder saw the handler
    on_path = [f for f in files if any(fnmatch.fnmatch(f, p) for p in FEATURE_MODULES)]
    assert on_path == [], f"feature modules on a plain chat request's path: {on_path}"
