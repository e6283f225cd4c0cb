"""Helpers for the verification tests: an engine with a verifier on a demo model, a recording
sink, and faulty kernels that corrupt a fraction of their outputs the way a broken one would."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest, TokenOutput
from runtime.engine.sampling import SamplingParams
from runtime.engine.stats import FanOut, StatsSink
from runtime.memory import Allocator
from runtime.models.loader import load_model
from runtime.verify.verifier import Verifier
from tests.runtime.engine.support import RecordingSink

# the recording sink of the engine tests keeps verification results too
Recorder = RecordingSink


def corrupting(kernel: Callable[..., Any], fraction: float = 0.05) -> Callable[..., Any]:
    """`kernel` with about `fraction` of its output elements replaced by garbage. Which elements
    and their values depend only on the flat index (deterministic, thread-safe: the engine and
    the verifier call it from different threads)."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        out = kernel(*args, **kwargs)
        if isinstance(out, tuple):  # apply_rotary returns (q, k)
            return tuple(_corrupt(t, fraction) for t in out)
        return _corrupt(out, fraction)

    return broken


def _corrupt(t: torch.Tensor, fraction: float) -> torch.Tensor:
    idx = torch.arange(t.numel(), device=t.device)
    bad = (idx * 2654435761) % 1000 < int(fraction * 1000)  # Knuth hash: scattered lanes
    garbage = (torch.sin(idx.double()) * 8.0).to(t.dtype)
    return torch.where(bad, garbage, t.flatten()).view(t.shape)


def random_prompts(n: int, vocab: int, *, max_len: int = 10, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (n,), generator=g).tolist()
    return [torch.randint(3, vocab, (k,), generator=g).tolist() for k in lengths]


@contextmanager
def verified_engine(
    model_dir: Path,
    sinks: Sequence[StatsSink],
    *,
    sample_rate: float = 1.0,
    queue_size: int = 4096,
    dtype: str = "float32",
    verifier: Verifier | None = None,
    **config: Any,
) -> Iterator[tuple[Engine, Verifier]]:
    """An engine on `model_dir` whose stats and verification results go to `sinks` (FanOut);
    `config`: EngineConfig overrides."""
    fanout = FanOut(sinks)
    verifier = verifier or Verifier(fanout, sample_rate=sample_rate, queue_size=queue_size)
    fields: dict[str, Any] = {"max_num_seqs": 64, "initial_num_seqs": 64, **config}
    engine = Engine(
        EngineConfig(model_name="tiny", device="cpu", dtype=dtype, **fields),
        fanout,
        loader=lambda: load_model(model_dir, dtype=dtype, device="cpu"),
        allocator=Allocator(device="cpu"),
        verifier=verifier,
    )
    try:
        yield engine, verifier
    finally:
        engine.shutdown(drain_timeout_s=5.0)
        verifier.close(timeout=60.0)


def serve(
    engine: Engine, prompts: list[list[int]], *, max_tokens: int = 1, prefix: str = "req"
) -> list[TokenOutput]:
    """Submit all prompts at once (the engine batches them), wait for every result."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    handles = [
        engine.submit(GenerationRequest(f"{prefix}-{i}", p, params)) for i, p in enumerate(prompts)
    ]
    return [h.result(timeout=120) for h in handles]
