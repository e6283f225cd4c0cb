"""Which C allocator the server process runs on: jemalloc by default where it is installed.

The tiers own the memory the engine asks for by name (KV, scratch); everything else (PyTorch's
CPU activations, Python objects, tokenizer buffers) comes from the C library's malloc. glibc keeps
freed chunks resident until a trim and raises its mmap threshold after each big free, so the
embeddings server's RSS swung by 7-13% from one sample to the next with no trend (docs/soak.md);
fixing the threshold flattened it at 10-20% of the throughput. jemalloc returns freed pages on its
own (per-arena decay, with a background purging thread), so `fastllm serve` runs on it by default:
`malloc = auto` re-executes the process once with Debian's libjemalloc2 preloaded when the
library is there (LD_PRELOAD only works at exec time) and says how to get it when not;
`jemalloc` insists (a one-line error without it), `glibc` leaves the process alone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

JEMALLOC_SONAME = "libjemalloc.so.2"
# Debian's multiarch directories first (libjemalloc2 installs there), then the usual others
SEARCH_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/local/lib",
    "/usr/lib64",
    "/usr/lib",
)
# Return dirty pages within ~1 s from a background thread (jemalloc's default decay is 10 s,
# purged only when an arena is next used): the RSS then follows what the process holds.
# One arena: by default jemalloc gives each thread one of 4 x CPUs arenas, so a forward's
# buffers freed on one worker thread sat dirty in its arena while the next request, on another
# thread, faulted in fresh pages from its own; the RSS then depended on how many arenas held a
# forward's worth when it was read (embeddings soak: 3.8-5.1% fluctuation with 8 arenas, 1.2-1.7%
# with one and 30-50 MiB less, docs/soak.md). Small allocations stay lock-free in thread caches.
DEFAULT_MALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:1"
REEXEC_MARK = "FASTLLM_MALLOC_REEXEC"  # set on the re-executed process: never a second exec
MODES = ("auto", "jemalloc", "glibc")
INSTALL_HINT = "apt-get install libjemalloc2"


# Only the process's own command line may re-execute it: a `serve` invoked in-process (click's
# CliRunner in tests, an embedding program) must never replace its host process.
_reexec_allowed = False


def allow_reexec() -> None:
    """Called by the console entry point when it runs the process's own argv."""
    global _reexec_allowed
    _reexec_allowed = True


class MallocUnavailable(RuntimeError):
    """`malloc = jemalloc` where no libjemalloc.so.2 is installed."""


def find_jemalloc(search_dirs: Sequence[str] = SEARCH_DIRS) -> Path | None:
    for directory in search_dirs:
        candidate = Path(directory) / JEMALLOC_SONAME
        if candidate.is_file():
            return candidate
    return None


def loaded_malloc(maps_text: str | None = None) -> str:
    """'jemalloc' when the library is mapped into this process, else 'glibc' (the C library's
    own; on musl or macOS that name is loose, and nothing here runs there)."""
    if maps_text is None:
        try:
            maps_text = Path("/proc/self/maps").read_text()
        except OSError:
            return "glibc"
    return "jemalloc" if "libjemalloc" in maps_text else "glibc"


def preload_env(env: Mapping[str, str], library: Path) -> dict[str, str]:
    """`env` with `library` first on LD_PRELOAD (what is there already kept after it) and the
    purging configuration unless the operator set MALLOC_CONF."""
    out = dict(env)
    existing = [p for p in out.get("LD_PRELOAD", "").replace(":", " ").split() if p]
    out["LD_PRELOAD"] = " ".join([str(library), *[p for p in existing if p != str(library)]])
    out.setdefault("MALLOC_CONF", DEFAULT_MALLOC_CONF)
    out[REEXEC_MARK] = "1"
    return out


def reexec_plan(
    mode: str,
    env: Mapping[str, str],
    *,
    library: Path | None,
    current: str,
) -> dict[str, str] | None:
    """The environment to re-execute with, or None to go on as is.

    Raises MallocUnavailable for `jemalloc` without the library, or when a re-exec already
    happened and still did not load it (a broken preload: never loop)."""
    if mode not in MODES:
        raise ValueError(f"malloc must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "glibc" or current == "jemalloc":
        return None
    if env.get(REEXEC_MARK) == "1":  # this is the re-executed process and jemalloc is not in
        if mode == "jemalloc":
            raise MallocUnavailable(f"LD_PRELOAD of {library} did not load jemalloc")
        return None
    if library is None:
        if mode == "jemalloc":
            raise MallocUnavailable(f"malloc = jemalloc, but no {JEMALLOC_SONAME} ({INSTALL_HINT})")
        return None
    return preload_env(env, library)


def ensure_malloc(mode: str) -> str:
    """Re-execute this process on jemalloc when `mode` asks for it and it is installed (the
    same pid, argv and environment plus LD_PRELOAD); returns the allocator in use otherwise.
    Only after `allow_reexec()` (the console entry point)."""
    if not _reexec_allowed:
        if mode == "jemalloc" and loaded_malloc() != "jemalloc":
            raise MallocUnavailable("malloc = jemalloc needs `fastllm serve` as its own process")
        return loaded_malloc()
    plan = reexec_plan(mode, os.environ, library=find_jemalloc(), current=loaded_malloc())
    if plan is None:
        return loaded_malloc()
    sys.stdout.flush()
    sys.stderr.flush()
    # orig_argv: the command line as typed, `-m runtime.cli serve ...` or the console script
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], plan)
    raise AssertionError("unreachable")  # pragma: no cover
