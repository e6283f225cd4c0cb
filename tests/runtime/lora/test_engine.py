"""Adapters through the engine: a mixed batch (4 adapters + base rows) gives each row the tokens
it gets alone; adapted greedy tokens are PEFT's; prefix pages are keyed by adapter; residency
(LRU of max_loras, evictions, reloads) and the allocator bytes back after unloading."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from runtime.engine.engine import Engine
from runtime.engine.request import GenerationRequest
from runtime.errors import ConflictError, ModelNotFoundError, Overloaded
from runtime.memory import Allocator
from runtime.models.lora import LoraAdapterError
from tests.runtime.engine.support import RecordingSink, engine_config, greedy, random_prompts
from tests.runtime.lora.adapters import peft_reference


@pytest.fixture(scope="module")
def sink() -> RecordingSink:
    return RecordingSink()


@pytest.fixture(scope="module")
def engine(base_dir: Path, adapter_dirs: dict[str, Path], sink: RecordingSink) -> Iterator[Engine]:
    loras = tuple((name, str(path)) for name, path in adapter_dirs.items())
    config = engine_config(model_path=base_dir, loras=loras, max_loras=4, kv_block_size=4)
    eng = Engine(config, sink=sink, allocator=Allocator(device="cpu"))
    yield eng
    eng.shutdown()


def _run(engine: Engine, rid: str, prompt: list[int], lora: str = "", n: int = 6) -> list[int]:
    request = GenerationRequest(rid, prompt, greedy(n), lora=lora)
    return engine.submit(request).result(timeout=120).token_ids


def _peft_greedy(base: Path, adapter: Path, prompt: list[int], n: int) -> list[int]:
    model, ids = peft_reference(base, adapter), list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_mixed_batch_rows_match_alone(engine: Engine) -> None:
    names = ["", "a1", "a2", "a3", "a4", "", "a1", "a3"]
    prompts = random_prompts(len(names), 3, 12, engine.loaded.args.vocab_size, seed=11)
    alone = [
        _run(engine, f"alone-{i}", p, lora)
        for i, (p, lora) in enumerate(zip(prompts, names, strict=True))
    ]
    handles = [
        engine.submit(GenerationRequest(f"mixed-{i}", p, greedy(6), lora=lora))
        for i, (p, lora) in enumerate(zip(prompts, names, strict=True))
    ]
    mixed = [h.result(timeout=120).token_ids for h in handles]
    assert mixed == alone
    # the adapters do change the output (B != 0): the rows are not all the base model's
    base_tokens = [_run(engine, f"base-{i}", p) for i, p in enumerate(prompts)]
    assert sum(a != b for a, b in zip(alone, base_tokens, strict=True)) >= 3


def test_greedy_tokens_are_peft(engine: Engine, base_dir: Path, adapter_dirs) -> None:
    prompt = random_prompts(1, 7, 7, engine.loaded.args.vocab_size, seed=3)[0]
    for name in ("a1", "a3"):
        got = _run(engine, f"peft-{name}", prompt, name, n=5)
        assert got == _peft_greedy(base_dir, adapter_dirs[name], prompt, 5)


def test_prefix_pages_keyed_by_adapter(engine: Engine, sink: RecordingSink) -> None:
    prompt = random_prompts(1, 24, 24, engine.loaded.args.vocab_size, seed=21)[0]
    order = [("p-base", ""), ("p-a1", "a1"), ("p-a2", "a2"), ("p-a1-again", "a1")]
    for rid, lora in order:
        engine.submit(GenerationRequest(rid, prompt, greedy(2), lora=lora)).result(timeout=60)
    stats = sink.by_id()
    assert stats["p-a1"].cached_tokens == 0  # nothing from the base's pages
    assert stats["p-a2"].cached_tokens == 0  # nor from another adapter's
    assert stats["p-a1-again"].cached_tokens >= 16  # its own adapter's pages are reused
    assert stats["p-a1"].adapter == "a1" and stats["p-base"].adapter is None


def test_unknown_adapter_is_not_found(engine: Engine) -> None:
    with pytest.raises(ModelNotFoundError):
        engine.submit(GenerationRequest("nope", [5, 6, 7], greedy(2), lora="missing"))


def test_load_unload_returns_bytes_and_lru(base_dir: Path, adapter_dirs) -> None:
    allocator = Allocator(device="cpu")
    config = engine_config(model_path=base_dir, max_loras=2, batch_warmup=False)
    engine = Engine(config, allocator=allocator)
    try:
        engine.load()
        baseline = allocator.stats().bytes_in_use
        sizes = {name: engine.load_lora(name, str(adapter_dirs[name])) for name in ("a1", "a2")}
        assert allocator.stats().bytes_in_use == baseline + sum(sizes.values())
        with pytest.raises(ConflictError):
            engine.load_lora("a1", str(adapter_dirs["a1"]))
        engine.load_lora("a3", str(adapter_dirs["a3"]))  # beyond max_loras: a1 (LRU) evicted
        stats = engine.lora_stats()
        assert stats is not None and stats.evictions_total == 1
        assert sorted(stats.resident_bytes) == ["a2", "a3"] and "a1" in stats.registered
        _run(engine, "reload", [4, 5, 6], "a1", n=2)  # a1 read again; a2 now the LRU
        stats = engine.lora_stats()
        assert stats is not None and sorted(stats.resident_bytes) == ["a1", "a3"]
        assert stats.loads_total == 4 and stats.evictions_total == 2
        for name in ("a1", "a2", "a3"):
            engine.unload_lora(name)
        assert allocator.stats().bytes_in_use == baseline
        with pytest.raises(ModelNotFoundError):
            engine.unload_lora("a1")
        with pytest.raises(LoraAdapterError):
            engine.load_lora("bad", str(base_dir / "nowhere"))
        assert allocator.stats().bytes_in_use == baseline
    finally:
        engine.shutdown()


def test_a_closed_sequence_lets_go_of_its_adapter(base_dir: Path, adapter_dirs) -> None:
    """An unloaded adapter's bytes come back even while its finished sequences live on (a
    handle, a GC cycle, a stats record): closing a sequence drops its weights reference. The
    CI run of the hot-swap test once found the block still pending here."""
    allocator = Allocator(device="cpu")
    engine = Engine(engine_config(model_path=base_dir, batch_warmup=False), allocator=allocator)
    try:
        engine.load()
        baseline = allocator.stats().bytes_in_use
        engine.load_lora("a1", str(adapter_dirs["a1"]))
        core = engine._parts.core
        closed, on_close = [], core.on_close
        assert on_close is not None
        core.on_close = lambda seq: (on_close(seq), closed.append(seq))  # keeps them alive
        _run(engine, "kept", [4, 5, 6], "a1", n=3)
        assert len(closed) == 1
        engine.unload_lora("a1")
        assert allocator.stats().bytes_in_use == baseline
    finally:
        engine.shutdown()


def test_every_slot_busy_is_overloaded(base_dir: Path, adapter_dirs) -> None:
    config = engine_config(model_path=base_dir, max_loras=1, batch_warmup=False)
    sink = RecordingSink()
    engine = Engine(config, sink=sink, allocator=Allocator(device="cpu"))
    try:
        engine.load_lora("a1", str(adapter_dirs["a1"]))
        engine.load_lora("a2", str(adapter_dirs["a2"]))  # evicts idle a1
        long = engine.submit(GenerationRequest("long", [4, 5, 6], greedy(400), lora="a2"))
        with pytest.raises(Overloaded):  # a2 is in use: a1 cannot come back now
            engine.submit(GenerationRequest("other", [4, 5], greedy(2), lora="a1"))
        refused = sink.by_id()["other"]  # recorded by the engine, like admission's refusals
        assert refused.failure_reason == "overloaded" and refused.adapter == "a1"
        long.result(timeout=120)
        _run(engine, "after", [4, 5], "a1", n=2)  # a2 idle again: evicted for a1
    finally:
        engine.shutdown()


def test_choices_and_logprobs_with_an_adapter(engine: Engine, base_dir: Path, adapter_dirs) -> None:
    """n > 1 forks an adapted sequence's pages (the forks keep the adapter), and logprobs are
    the adapted model's distribution (PEFT's log_softmax)."""
    prompt = random_prompts(1, 6, 6, engine.loaded.args.vocab_size, seed=9)[0]
    alone = _run(engine, "n-alone", prompt, "a2", n=4)
    params = greedy(4, n=2, logprobs=2)
    handle = engine.submit(GenerationRequest("n-two", prompt, params, lora="a2"))
    tokens: dict[int, list[int]] = {0: [], 1: []}
    firsts = {}
    for out in handle:
        tokens[out.index] += out.token_ids
        if out.logprobs:
            firsts.setdefault(out.index, out.logprobs[0])
    assert tokens == {0: alone, 1: alone}  # greedy: both choices are the adapted model's
    model = peft_reference(base_dir, adapter_dirs["a2"])
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].float()
    want = torch.log_softmax(logits, dim=-1)
    first = firsts[0]
    assert first.token_id == alone[0]
    assert abs(first.logprob - float(want[alone[0]])) < 1e-4


def test_idle_self_check_counts_adapters_as_owned(engine: Engine) -> None:
    """Resident adapters' blocks have a live owner; nothing is an orphan while they are."""
    assert engine.self_check is not None
    result = engine.self_check.check(0.0)
    assert result.orphan_blocks == 0, result.orphan_owners


def test_a_load_in_progress_counts_as_loading(
    base_dir: Path, adapter_dirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fastllm_lora_adapters{state="loading"}` reads this: an adapter is loading while its
    files are read, and no longer once it is resident."""
    from runtime.engine.lora import registry as registry_module

    reading, release = threading.Event(), threading.Event()
    read = registry_module.read_adapter

    def slow_read(*args, **kwargs):
        reading.set()
        assert release.wait(60)
        return read(*args, **kwargs)

    monkeypatch.setattr(registry_module, "read_adapter", slow_read)
    engine = Engine(engine_config(model_path=base_dir, batch_warmup=False))
    try:
        engine.load()
        loader = threading.Thread(target=engine.load_lora, args=("a1", str(adapter_dirs["a1"])))
        loader.start()
        assert reading.wait(60)
        stats = engine.lora_stats()
        assert stats is not None and stats.num_loading == 1 and stats.num_resident == 0
        release.set()
        loader.join(60)
        stats = engine.lora_stats()
        assert stats is not None and stats.num_loading == 0 and stats.num_resident == 1
    finally:
        release.set()
        engine.shutdown()
