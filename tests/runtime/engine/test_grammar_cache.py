"""The compiled-grammar cache (LRU in bytes, shared in-flight compiles, failures not cached) and a
matcher's rollback, on the demo tokenizer's vocabulary."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import xgrammar as xgr

from runtime.engine.constraints import ConstraintSpec, ConstraintState, GrammarCache
from runtime.engine.constraints.vocab import tokenizer_info
from runtime.models.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(demo_tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(demo_tokenizer_dir)


@pytest.fixture(scope="module")
def info(tokenizer: Tokenizer) -> xgr.TokenizerInfo:
    return tokenizer_info(tokenizer, 512)


def choice(*words: str) -> ConstraintSpec:
    return ConstraintSpec.choice(list(words), "guided_choice")


def test_lru_evicts_the_least_recently_used_within_the_byte_bound(info) -> None:
    first, second, third = choice("a", "b"), choice("c", "d"), choice("e", "f")
    # compiled in this process: a worker measures its heap growth, which varies from one
    # compile to the next, so sizes probed in one cache need not match another's (a CI flake)
    inline = lambda compiler, grammar: compiler.compile_grammar(grammar)  # noqa: E731
    probe = GrammarCache(info, compile_fn=inline)
    s1, s2, s3 = (probe.get(c)[0].result(timeout=30).size_bytes for c in (first, second, third))
    probe.close()
    cache = GrammarCache(info, max_bytes=max(s1 + s2, s1 + s3), compile_fn=inline)  # two fit
    assert s1 + s2 + s3 > cache.max_bytes
    for spec in (first, second):
        cache.get(spec)[0].result(timeout=30)
    assert cache.get(first)[1] is True  # a hit: `first` is now the most recent
    cache.get(third)[0].result(timeout=30)
    stats = cache.stats()
    assert (
        stats.num_evictions == 1 and stats.num_entries == 2 and stats.size_bytes <= stats.max_bytes
    )
    assert cache.get(first)[1] is True and cache.get(second)[1] is False  # `second` went
    assert (cache.stats().num_hits, cache.stats().num_misses) == (2, 4)
    cache.close()


def test_requests_for_a_grammar_being_compiled_share_the_compile(info) -> None:
    gate, compiles = threading.Event(), []

    def held(compiler, grammar):
        compiles.append(1)
        gate.wait(30)
        return compiler.compile_grammar(grammar)

    cache = GrammarCache(info, compile_fn=held)
    (one, hit_one), (two, hit_two) = cache.get(choice("x")), cache.get(choice("x"))
    assert one is two and (hit_one, hit_two) == (False, True) and not one.done()
    gate.set()
    assert one.result(timeout=30).compile_seconds >= 0 and len(compiles) == 1
    cache.close()


def test_a_failed_compile_is_not_cached(info) -> None:
    calls = []

    def flaky(compiler, grammar):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected compile failure")
        return compiler.compile_grammar(grammar)

    cache = GrammarCache(info, compile_fn=flaky)
    future, _ = cache.get(choice("y"))
    with pytest.raises(RuntimeError, match="injected"):
        future.result(timeout=30)
    again, hit = cache.get(choice("y"))
    assert hit is False and again.result(timeout=30).size_bytes > 0
    cache.close()


def test_sync_rolls_the_matcher_back_to_the_kept_output(info, tokenizer: Tokenizer) -> None:
    cache = GrammarCache(info)
    spec = choice("cat", "dog")
    future, hit = cache.get(spec)
    future.result(timeout=30)
    state = ConstraintState(spec, future, hit)
    state.bind()
    cat = tokenizer.encode("cat", add_special_tokens=False)
    dog = tokenizer.encode("dog", add_special_tokens=False)
    assert cat[0] != dog[0]
    assert all(state.accept(t) for t in cat) and state.is_complete
    assert not state.accept(dog[0])  # a token the grammar does not allow here: refused
    state.sync(0)  # the step that produced "cat" was dropped: back to the start
    assert state.num_accepted == 0 and not state.is_complete
    assert all(state.accept(t) for t in dog) and state.is_complete
    assert state.compile_seconds is not None  # it waited for this compile (a miss)
    cache.close()
