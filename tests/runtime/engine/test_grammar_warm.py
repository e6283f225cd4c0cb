"""Grammar compile workers start at the first job or at `warm()`, never with the pool: a process
that never compiles never boots the forkserver (torch, transformers and XGrammar imported in a
second Python). `serve` warms its engines' pools once they have loaded."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import xgrammar as xgr

from runtime.engine.constraints.limits import GrammarLimits
from runtime.engine.constraints.pool import CompilePool
from runtime.engine.constraints.vocab import tokenizer_info
from runtime.models.tokenizer import Tokenizer
from runtime.server.app import warm_grammar_workers
from tests.fixtures.serve_hooks import serve_after_load


@pytest.fixture(scope="module")
def info(demo_tokenizer_dir: Path) -> xgr.TokenizerInfo:
    return tokenizer_info(Tokenizer.from_dir(demo_tokenizer_dir), 512)


def wait_for_workers(pool: CompilePool, num: int) -> list[int]:
    deadline = time.monotonic() + 60
    while len(pool.worker_pids()) < num and time.monotonic() < deadline:
        time.sleep(0.05)
    return pool.worker_pids()


def test_no_worker_starts_before_a_job_or_warm(info: xgr.TokenizerInfo) -> None:
    pool = CompilePool(info.serialize_json(), GrammarLimits(num_workers=2))
    try:
        time.sleep(0.3)  # the slots' threads are running: none started a worker
        assert pool.worker_pids() == []
        pool.warm()
        assert len(wait_for_workers(pool, 2)) == 2
    finally:
        pool.close()


def test_the_first_job_starts_every_worker(info: xgr.TokenizerInfo) -> None:
    pool = CompilePool(info.serialize_json(), GrammarLimits(num_workers=2))
    try:
        assert pool.submit("regex", "ab", "t").future.result(timeout=60).size_bytes > 0
        assert len(wait_for_workers(pool, 2)) == 2  # the idle slot's too, for the next job
    finally:
        pool.close()


def test_serve_warms_the_grammar_workers_after_the_load(
    monkeypatch: pytest.MonkeyPatch, demo_model_dir: Callable[[str], Path]
) -> None:
    model = demo_model_dir("llama")
    # the suite runs its servers with false (tests/conftest.py)
    on = serve_after_load(monkeypatch, model, FASTLLM_GRAMMAR_WARM="true")
    off = serve_after_load(monkeypatch, model, FASTLLM_GRAMMAR_WARM="false")
    assert [getattr(hook, "func", None) for hook in on].count(warm_grammar_workers) == 1
    assert warm_grammar_workers not in [getattr(hook, "func", None) for hook in off]
