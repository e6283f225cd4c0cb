"""Features merged from separate branches that must not meet half-built: a split model refuses
LoRA adapters and a self-draft with one line; a step with a LoRA row drafts nothing (speculative
verification runs the base forward only)."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.engine.config import EngineConfig
from runtime.engine.scheduled import SchedulerConfig, SchedulerOutput
from runtime.engine.scheduler import Scheduler
from runtime.engine.spec.config import SpecConfig
from runtime.errors import ConfigError
from tests.runtime.engine.test_fair_share import seq
from tests.runtime.engine.test_scheduler import make_kv


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"loras": (("a", "/adapters/a"),)}, "LoRA"),
        ({"spec": SpecConfig(method="self_draft")}, "self_draft"),
    ],
)
def test_a_split_model_refuses_what_is_not_sharded_yet(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named) as exc:
        EngineConfig(model_name="tiny", device="cpu", tensor_parallel_size=2, **fields)
    assert exc.value.param == "tensor_parallel_size"
    EngineConfig(model_name="tiny", device="cpu", tensor_parallel_size=1, **fields)  # alone: fine


class _Recording:
    method = "ngram"

    def __init__(self) -> None:
        self.planned: list[int] = []

    def plan(self, out: SchedulerOutput, budget_left: int) -> None:
        self.planned.append(len(out.items))

    def settle(self, *args: Any, **kwargs: Any) -> None:
        pass


@pytest.mark.parametrize(("lora", "drafts"), [(False, [1]), (True, [])])
def test_a_step_with_a_lora_row_drafts_nothing(lora: bool, drafts: list[int]) -> None:
    s = Scheduler(SchedulerConfig(8, 100, 10_000), make_kv())
    speculator = _Recording()
    s.speculator = speculator  # type: ignore[assignment]
    sequence = seq("r")
    if lora:
        sequence.features = _features_with_lora()
    s.add(sequence)
    out = s.schedule(8)
    assert out.num_lora == int(lora)
    assert speculator.planned == drafts


def _features_with_lora() -> Any:
    from runtime.engine.features import SeqFeatures

    return SeqFeatures(lora=object())  # type: ignore[arg-type]  # the scheduler counts it only
