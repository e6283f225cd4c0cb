"""The C allocator choice (runtime.memory.host_malloc): when `serve` re-executes on jemalloc,
with what environment, and when it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.memory.host_malloc import (
    DEFAULT_MALLOC_CONF,
    REEXEC_MARK,
    MallocUnavailable,
    find_jemalloc,
    loaded_malloc,
    preload_env,
    reexec_plan,
)

LIB = Path("/opt/lib/libjemalloc.so.2")


def test_find_jemalloc_takes_the_first_directory_that_has_it(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (second / "libjemalloc.so.2").write_bytes(b"")
    assert find_jemalloc([str(first), str(second)]) == second / "libjemalloc.so.2"
    assert find_jemalloc([str(first)]) is None


def test_loaded_malloc_reads_the_mappings() -> None:
    maps = "7f00-7f10 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"
    assert loaded_malloc(maps) == "jemalloc"
    assert loaded_malloc("7f00-7f10 r-xp 0 08:01 1 /usr/lib/libc.so.6\n") == "glibc"


def test_preload_env_puts_jemalloc_first_and_keeps_the_rest() -> None:
    env = preload_env({"LD_PRELOAD": "/x/libfoo.so", "PATH": "/bin"}, LIB)
    assert env["LD_PRELOAD"] == f"{LIB} /x/libfoo.so"
    assert env["PATH"] == "/bin"
    assert env["MALLOC_CONF"] == DEFAULT_MALLOC_CONF
    assert env[REEXEC_MARK] == "1"
    # an operator's own jemalloc configuration wins
    assert preload_env({"MALLOC_CONF": "narenas:1"}, LIB)["MALLOC_CONF"] == "narenas:1"


def test_auto_reexecs_once_when_the_library_is_there() -> None:
    plan = reexec_plan("auto", {}, library=LIB, current="glibc")
    assert plan is not None and plan["LD_PRELOAD"] == str(LIB)
    # already on jemalloc, or glibc asked for: nothing to do
    assert reexec_plan("auto", {}, library=LIB, current="jemalloc") is None
    assert reexec_plan("glibc", {}, library=LIB, current="glibc") is None
    # the re-executed process that still has no jemalloc goes on, never loops
    assert reexec_plan("auto", {REEXEC_MARK: "1"}, library=LIB, current="glibc") is None


def test_auto_without_the_library_goes_on_with_glibc() -> None:
    assert reexec_plan("auto", {}, library=None, current="glibc") is None


def test_jemalloc_required_but_absent_or_broken_is_an_error() -> None:
    with pytest.raises(MallocUnavailable, match="apt-get install libjemalloc2"):
        reexec_plan("jemalloc", {}, library=None, current="glibc")
    with pytest.raises(MallocUnavailable, match="did not load"):
        reexec_plan("jemalloc", {REEXEC_MARK: "1"}, library=LIB, current="glibc")


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="malloc must be one of"):
        reexec_plan("tcmalloc", {}, library=LIB, current="glibc")


def test_in_process_serve_never_replaces_its_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the console entry point's allow_reexec (CliRunner, main(argv), an embedding
    program) nothing is executed; insisting on jemalloc there is an error instead."""
    import runtime.memory.host_malloc as host_malloc

    def no_exec(*_: object) -> None:
        raise AssertionError("execve called in-process")

    monkeypatch.setattr(host_malloc, "_reexec_allowed", False)
    monkeypatch.setattr(host_malloc.os, "execve", no_exec)
    monkeypatch.setattr(host_malloc, "find_jemalloc", lambda: LIB)
    monkeypatch.setattr(host_malloc, "loaded_malloc", lambda maps_text=None: "glibc")
    assert host_malloc.ensure_malloc("auto") == "glibc"
    with pytest.raises(MallocUnavailable, match="its own process"):
        host_malloc.ensure_malloc("jemalloc")
