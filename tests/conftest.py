"""Shared fixtures. Heavy fixtures live in tests/fixtures/ and are registered here as plugins."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.fixtures.garbage import collecting_what_the_test_leaves

pytest_plugins: list[str] = ["tests.fixtures.prometheus"]
pytest_plugins.append("tests.fixtures.demo_models")  # demo_model_dir, demo_tokenizer_dir
pytest_plugins.append("tests.fixtures.real_model")  # smollm2_gguf, smollm2_dir, smollm2_hf
pytest_plugins.append("tests.fixtures.postgres")  # postgres_cluster (stop/start), postgres_url
pytest_plugins.append("tests.fixtures.alertmanager")  # alertmanager_server, webhook_receiver
pytest_plugins.append("tests.fixtures.browser")  # browser (headless system Chromium, Selenium)
pytest_plugins.append("tests.fixtures.cpu_report")  # FASTLLM_TEST_CPU_REPORT: CPU per test


def require_binary(name: str, *candidates: str) -> str:
    """Path of an external binary, or skip with a reason; in CI (FASTLLM_REQUIRE_BINARIES=1)
    a missing binary is a failure, so a skip can never hide one there."""
    for candidate in (name, *candidates):
        path = candidate if os.path.isabs(candidate) and os.path.exists(candidate) else None
        path = path or shutil.which(candidate)
        if path:
            return path
    message = f"{name} is not installed (apt-get install the package that provides it)"
    if os.environ.get("FASTLLM_REQUIRE_BINARIES") == "1":
        pytest.fail(message)
    pytest.skip(message)
    raise AssertionError("unreachable")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test`), one intra-op thread per worker: N workers on fewer
    cores, each with a thread per core, would have OpenMP threads busy-waiting against each
    other's (CPU spent, nothing returned). Servers the tests start inherit it. A test about
    threads sets its own count (runtime.engine.threads).
    In every process, httpx reuses one default SSL context (tests.fixtures.httpx_ssl).
    The `fastllm serve` processes the tests start boot their grammar compile workers at their
    first constrained request, not after the load (`grammar_warm`): ~2.5 s of CPU a server that
    most never use; tests/runtime/engine/test_grammar_warm.py checks both."""
    from tests.fixtures.httpx_ssl import share_default_ssl_context

    share_default_ssl_context()
    os.environ.setdefault("FASTLLM_GRAMMAR_WARM", "false")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("MKL_NUM_THREADS", "1")
        import torch

        torch.set_num_threads(1)


# tryfirst: xdist's worker reads the xdist_group markers in its own modifyitems hook, registered
# after this conftest and so (pluggy calls the newest first) run before it otherwise: the groups
# would be added too late, and every worker would build its own cluster, browser and real model
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`cuda` tests run only where a CUDA device exists (`pytest -m cuda` on a GPU machine).
    Under pytest-xdist (`make test`: `--dist loadgroup`), tests of one costly per-process
    resource share a worker, and the longest units start first (tests.fixtures.groups)."""
    from tests.fixtures.groups import group_by_resource, longest_first

    group_by_resource(items)
    items[:] = longest_first(items)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a hard dependency
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; run `pytest -m cuda` on a GPU machine")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


# fixtures whose tests open database connections (SQLAlchemy pools, psycopg)
_DATABASE_FIXTURES = frozenset({"postgres_url", "postgres_cluster", "db_url", "engine"})


@pytest.fixture(autouse=True)
def _collect_garbage_after_database_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    """Collect after every test that touches a database, so a leaked connection warns (an error
    here) in the test that leaked it, not in whichever later test the collector runs in. Only
    those, and only what the test created (tests.fixtures.garbage): a full collection costs
    ~0.4 s with torch and transformers loaded."""
    if not _DATABASE_FIXTURES.intersection(request.fixturenames):
        yield
        return
    with collecting_what_the_test_leaves():
        yield
