"""Requests sampled for verification (runtime.verify) speculate: the logit the verifier gets for
the final token is the target's raw logit at that token's own position in the verifying forward,
the value the plain engine keeps, also when a stop among the emitted tokens ends the request
before the last of them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from torch import nn

from runtime.engine.engine import Engine
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.engine.spec.config import SpecConfig
from runtime.memory import Allocator
from runtime.models.loader import load_model
from tests.runtime.engine.support import RecordingSink, engine_config

if TYPE_CHECKING:
    from runtime.engine.sequence import Sequence

pytestmark = pytest.mark.usefixtures("one_torch_thread")
from tests.runtime.engine.support import one_torch_thread  # noqa: E402,F401  (the fixture)

TOL = 1e-4  # fp32: the verifying chunk and a one-token decode sum in another order
PROMPTS = [[5, 6, 7, 8, 9] * 6, [11, 12, 13] * 10, [40] * 20, list(range(3, 60)) * 2]


class _Capture:
    """A verifier that samples every request and keeps what it would be given."""

    def __init__(self) -> None:
        self.jobs: dict[str, tuple[list[int], float | None]] = {}

    def should_verify(self, request_id: str) -> bool:
        return True

    def submit_sequence(self, seq: Sequence, model: nn.Module, dtype: torch.dtype) -> bool:
        self.jobs[seq.request_id] = (list(seq.output_token_ids), seq.chosen_logit)
        return True


@pytest.mark.parametrize("method", ["ngram", "self_draft"])
def test_verified_requests_speculate_with_the_plain_chosen_logit(
    demo_model_dir: Callable[[str], Path], method: str
) -> None:
    loaded = load_model(demo_model_dir("llama"), device="cpu")
    # greedy to 24 tokens, and with a stop token that ends some rows inside a verified chunk
    params = [
        SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop_token_ids=(302,)),
    ]
    runs = []
    sink = RecordingSink()
    for spec in (SpecConfig(), SpecConfig(method=method, max_batch_for_speculation=64)):
        capture = _Capture()
        config = engine_config(batch_warmup=False, spec=spec)
        engine = Engine(
            config, sink, loader=lambda: loaded, allocator=Allocator(device="cpu"), verifier=capture
        )
        try:
            handles = [
                engine.submit(GenerationRequest(f"r{i}-{j}", prompt, p))
                for i, prompt in enumerate(PROMPTS)
                for j, p in enumerate(params)
            ]
            for handle in handles:
                handle.result()
        finally:
            engine.shutdown()
        runs.append(capture.jobs)
        if spec.method == "off":
            sink = RecordingSink()  # count the speculating run's drafts only
    plain, drafted = runs
    assert plain.keys() == drafted.keys() and len(plain) == 2 * len(PROMPTS)
    for rid, (tokens, logit) in plain.items():
        assert drafted[rid][0] == tokens
        other = drafted[rid][1]
        assert logit is not None and other is not None
        assert abs(other - logit) < TOL, rid
    assert any(len(tokens) < 24 for tokens, _ in plain.values())  # the stop token did stop one
    assert sum(s.num_draft_tokens for s in sink.steps) > 0
    assert sum(s.num_accepted_tokens for s in sink.steps) > 0
