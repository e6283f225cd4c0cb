"""Helpers for the engine tests: building engines on the demo models, a recording sink, a model
whose forward can be held or broken, and the `transformers` greedy reference."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.engine.stats import RequestStats, StepStats, VerificationResult
from runtime.memory import Allocator
from runtime.models.loader import LoadedModel, load_model


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny models on a shared 2-core machine: torch's intra-op threads only fight each other
    (a 64-wide matmul went from 30 ms to 0.1 ms with one thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class RecordingSink:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.steps: list[StepStats] = []
        self.finished: list[RequestStats] = []
        self.verified: list[VerificationResult] = []

    def record(
        self,
        step: StepStats | None = None,
        finished: Sequence[RequestStats] = (),
        verified: Sequence[VerificationResult] = (),
    ) -> None:
        with self.lock:
            if step is not None:
                self.steps.append(step)
            self.finished.extend(finished)
            self.verified.extend(verified)

    def by_id(self) -> dict[str, RequestStats]:
        with self.lock:
            return {r.request_id: r for r in self.finished}

    def by_op(self) -> dict[str, list[VerificationResult]]:
        out: dict[str, list[VerificationResult]] = {}
        with self.lock:
            for v in self.verified:
                out.setdefault(v.op, []).append(v)
        return out


class ModelHooks:
    """Wraps a loaded causal LM's forward: `hold()` parks the next forward until `release()`;
    `fail_next` makes forwards raise; `calls` counts forwards."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self._forward = loaded.model.forward
        self.entered = threading.Event()
        self._gate = threading.Event()
        self._gate.set()
        self.fail_next = 0
        self.oom_once_at_batch: int | None = None  # raise OutOfMemoryError once at this batch size
        self.calls = 0
        self.sleep_s = 0.0
        self._park: tuple[Callable[[list[Any]], bool], threading.Event] | None = None
        loaded.model.forward = self._hooked  # type: ignore[method-assign]

    def hold(self) -> None:
        self.entered.clear()
        self._gate.clear()

    def hold_when(self, batch: Callable[[list[Any]], bool]) -> threading.Event:
        """Park the first forward whose sequences satisfy `batch`, in the forward itself; the
        event returned is set once it is parked. A test that must look at the state between two
        given steps then does not race the engine thread to `hold()` (under load the engine ran
        on to the request's end first)."""
        self._park = (batch, threading.Event())
        return self._park[1]

    def release(self) -> None:
        self._gate.set()

    def _hooked(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.calls += 1
        self.entered.set()
        self._gate.wait()
        if self.sleep_s:
            threading.Event().wait(self.sleep_s)
        seqs = args[1] if len(args) > 1 else kwargs["seqs"]
        if self._park is not None and self._park[0](seqs):
            self._gate.clear()
            self._park, parked = None, self._park[1]
            parked.set()
            self._gate.wait()
        if self.oom_once_at_batch is not None and len(seqs) >= self.oom_once_at_batch:
            self.oom_once_at_batch = None
            raise torch.OutOfMemoryError("injected out of memory")
        if self.fail_next > 0:
            self.fail_next -= 1
            raise RuntimeError("injected model failure")
        return self._forward(*args, **kwargs)


def engine_config(**overrides: Any) -> EngineConfig:
    # eager: ModelHooks wrap the module forward, which the fast decode step does not call
    # (tests/runtime/engine/test_fast_path.py covers the engine on the fast path)
    fields: dict[str, Any] = {
        "model_name": "tiny",
        "device": "cpu",
        "max_num_seqs": 16,
        "compile": "off",
    }
    fields.update(overrides)
    return EngineConfig(**fields)


def make_engine(
    model_dir: Path, sink: RecordingSink | None = None, **overrides: Any
) -> tuple[Engine, Callable[[], ModelHooks]]:
    """An engine on `model_dir` whose loader installs ModelHooks; the second value returns them."""
    hooks: list[ModelHooks] = []

    def loader() -> LoadedModel:
        loaded = load_model(model_dir, device="cpu")
        if loaded.is_causal_lm:
            hooks.append(ModelHooks(loaded))
        return loaded

    allocator = Allocator(device="cpu")  # the test's own: leak checks see only this engine
    engine = Engine(engine_config(**overrides), sink, loader=loader, allocator=allocator)
    return engine, lambda: hooks[0]


def live_owners(engine: Engine) -> list[str]:
    """Owners of what the engine's allocator still holds besides the KV pool's own rows (free,
    cached, shared and zero pages): requests that hold KV pages, and any other block."""
    return sorted(b.owner for b in engine.leak_report() if not b.owner.startswith("kv-cache:"))


def greedy(max_tokens: int, **kwargs: Any) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kwargs)


def request(
    rid: str, prompt: list[int], params: SamplingParams, **kwargs: Any
) -> GenerationRequest:
    return GenerationRequest(rid, prompt, params, **kwargs)


def random_prompts(n: int, lo: int, hi: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(3, vocab, (k,), generator=g).tolist() for k in lengths]


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    """One request at a time through `transformers` (no KV cache: full forward per token)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outputs = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see one_torch_thread
    with torch.inference_mode():
        for prompt, n in zip(prompts, max_tokens, strict=True):
            ids = torch.tensor([prompt])
            for _ in range(n):
                next_id = model(ids).logits[0, -1].argmax()
                ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
            outputs.append(ids[0, len(prompt) :].tolist())
    torch.set_num_threads(threads)
    return outputs
