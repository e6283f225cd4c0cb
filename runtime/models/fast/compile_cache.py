"""Where inductor keeps what it compiled for a model, so that a restart does not compile again.

Inductor's on-disk caches (its FX graph cache, AOT autograd's cache, the built C++ kernels) live
under `TORCHINDUCTOR_CACHE_DIR`, by default one directory in /tmp shared by every process of the
user and wiped at reboot. The compiled step's are kept per model instead:

    <compile_cache_dir>/<model dir name>-<12 hex digits>/

the digits a hash of the model's resolved path, its files' sizes and times, dtype and weight
format (a different or rewritten file, another format: a different directory; the caches' own
keys still decide what is reused inside it). The saved graphs of the step (`precompiled`) are
files in it too.
`compile_cache_dir` defaults to $XDG_CACHE_HOME/fastllm/compile (~/.cache/fastllm/compile).
The variable is set only while the step compiles (at load, under the build lock) and restored
after, so models in one process keep their own directories.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch

_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


def default_cache_root() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "fastllm" / "compile"


def model_cache_dir(root: Path | None, model_path: Path, dtype: torch.dtype, fmt: str) -> Path:
    """`fmt`: the weight format ("float", "int4/g32+int8-head", ...)."""
    key = f"{model_path.resolve()}|{dtype}|{fmt}|torch {torch.__version__}|{_files(model_path)}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return (root or default_cache_root()) / f"{model_path.name or 'model'}-{digest}"


def _files(model_path: Path) -> str:
    """The checkpoint's files as they are now (names, sizes, times): the saved graphs bake in
    a config's constants (norm eps, rope), so a file rewritten in place gets a new directory."""
    paths = sorted(model_path.iterdir()) if model_path.is_dir() else [model_path]
    stats = []
    for path in paths:
        with contextlib.suppress(OSError):  # vanished meanwhile: left out of the key
            st = path.stat()
            stats.append(f"{path.name}:{st.st_size}:{st.st_mtime_ns}")
    return ",".join(stats)


@contextlib.contextmanager
def inductor_cache_dir(directory: Path) -> Iterator[Path]:
    """Inductor's caches under `directory` for the duration (created if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get(_VARIABLE)
    os.environ[_VARIABLE] = str(directory)
    try:
        yield directory
    finally:
        if previous is None:
            os.environ.pop(_VARIABLE, None)
        else:
            os.environ[_VARIABLE] = previous
