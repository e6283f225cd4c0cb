"""bench.attacks' verification part: SmolLM2 at verification rate 1.0 in fp32, int8 and int4 with
an int8 LM head (the configurations of issue 39), each served healthy and then with its kernel
corrupted (bench.verify_real.corrupted: the quantized linear, or fp32's rms_norm)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench import verify_real
from bench.model_arg import resolve_model
from runtime.models.gguf_io.packaged import packaged_gguf
from runtime.verify.tolerance import default_threshold

# (label, quantization, int8 LM head)
VERIFY_CONFIGS: list[tuple[str, str | None, bool]] = [
    ("fp32", None, False),
    ("int8", "int8", False),
    ("int4 + int8 head", "int4", True),
]


@dataclass
class VerifyRow:
    label: str
    requests: int
    verified: int  # probe results recorded on the healthy model
    anomalies: int  # on the healthy model: 0 expected
    kernel: str  # the corrupted kernel
    corrupted_requests: int
    caught: int  # anomalies with it corrupted: > 0 expected


def smollm2(cache_dir: Path = verify_real.DEFAULT_CACHE) -> Path | None:
    """The packaged GGUF converted once into `cache_dir` (None: the wheel is not installed)."""
    gguf = packaged_gguf()
    return None if gguf is None else resolve_model(gguf, cache_dir)


def verify_one(
    path: Path,
    label: str,
    quantization: str | None,
    head: bool,
    prompts: list[list[int]],
    corrupt_prompts: list[list[int]],
    max_tokens: int = 4,
) -> VerifyRow:
    """One configuration, loaded once: healthy, then with its kernel corrupted."""
    loaded = verify_real.load(path, quantization, head)
    threshold = default_threshold("float32", quantization)
    healthy, _ = verify_real.run(path, prompts, max_tokens, loaded, quantization)
    with verify_real.corrupted(quantization) as kernel:
        broken, _ = verify_real.run(path, corrupt_prompts, 2, loaded, quantization)
    return VerifyRow(
        label,
        len(prompts),
        len(healthy.items),
        verify_real.anomalies(healthy, threshold),
        kernel,
        len(corrupt_prompts),
        verify_real.anomalies(broken, threshold),
    )


def verify_all(path: Path, requests: int, corrupt_requests: int) -> list[VerifyRow]:
    tokenizer = verify_real.load(path).tokenizer
    prompts = verify_real.prompts_of(tokenizer, requests)
    corrupt_prompts = verify_real.prompts_of(tokenizer, corrupt_requests)
    return [
        verify_one(path, label, quantization, head, prompts, corrupt_prompts)
        for label, quantization, head in VERIFY_CONFIGS
    ]
