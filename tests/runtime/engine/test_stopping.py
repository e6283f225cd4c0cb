"""StopChecker: eos / stop ids / stop strings split over tokens / max_tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.engine.sampling import SamplingParams
from runtime.engine.stopping import StopChecker
from runtime.models.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(demo_tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(demo_tokenizer_dir)


def _run(tok: Tokenizer, text: str, **params: object) -> tuple[list[str], str | None, int]:
    """Feed `text`'s tokens one by one until the checker finishes; (deltas, reason, tokens used)."""
    checker = StopChecker(tok, SamplingParams(**{"max_tokens": 1000, **params}))  # type: ignore[arg-type]
    deltas: list[str] = []
    ids = tok.encode(text, add_special_tokens=False)
    for n, token_id in enumerate(ids, 1):
        delta, reason = checker.push(token_id)
        deltas.append(delta)
        if reason is not None:
            return deltas, reason, n
    return deltas, None, len(ids)


def _pieces(tok: Tokenizer, text: str) -> list[str]:
    return [tok.decode([i]) for i in tok.encode(text, add_special_tokens=False)]


def test_stop_string_across_tokens_is_not_emitted(tok: Tokenizer) -> None:
    text = "The answer is here. Question: what next?"
    stop = "Question:"
    # the stop string really is split over several tokens of this tokenizer
    assert not any(stop in piece for piece in _pieces(tok, text))
    deltas, reason, _ = _run(tok, text, stop=(stop,))
    assert reason == "stop"
    assert "".join(deltas) == "The answer is here. "
    assert not any("Q" in d for d in deltas)  # no part of the stop string ever went out


def test_stop_string_starting_inside_a_token(tok: Tokenizer) -> None:
    # "uest" starts in the middle of whatever token holds "Q"+"uest..."
    deltas, reason, _ = _run(tok, "A Question arrives", stop=("uest",))
    assert reason == "stop" and "".join(deltas) == "A Q"


def test_held_prefix_is_released_when_it_is_not_a_stop(tok: Tokenizer) -> None:
    text = "Quick answers are queued before Quiet ones."
    ids = tok.encode(text, add_special_tokens=False)
    deltas, reason, _ = _run(tok, text, stop=("Quiet!",))
    assert reason is None
    assert "".join(deltas) == text  # everything is released in the end
    # ...but while "Qu", "Quiet" could still become "Quiet!", the emitted text lagged the decoded
    lagging = [tok.decode(ids[:n])[len("".join(deltas[:n])) :] for n in range(1, len(ids) + 1)]
    held = [h for h in lagging if h]
    assert held and all("Quiet!".startswith(h) for h in held)


def test_earliest_of_several_stop_strings_wins(tok: Tokenizer) -> None:
    deltas, reason, _ = _run(tok, "one, two; three", stop=("three", ";", "two"))
    assert reason == "stop" and "".join(deltas) == "one, "


def test_eos_and_stop_token_ids(tok: Tokenizer) -> None:
    eos = tok.eos_token_ids[0]
    checker = StopChecker(tok, SamplingParams(max_tokens=10))
    ids = tok.encode("Hello", add_special_tokens=False)
    text = "".join(checker.push(i)[0] for i in ids)
    assert checker.push(eos) == ("", "stop")
    assert text == "Hello"

    ignoring = StopChecker(tok, SamplingParams(max_tokens=10, ignore_eos=True))
    assert ignoring.push(eos)[1] is None

    stop_id = ids[-1]
    custom = StopChecker(tok, SamplingParams(max_tokens=10, stop_token_ids=(stop_id,)))
    out = [custom.push(i) for i in ids]
    assert out[-1][1] == "stop" and "".join(d for d, _ in out) == tok.decode(ids[:-1])


def test_max_tokens_gives_length_and_flushes_held_text(tok: Tokenizer) -> None:
    ids = tok.encode("Hello Qu", add_special_tokens=False)
    checker = StopChecker(tok, SamplingParams(max_tokens=len(ids), stop=("Question",)))
    out = [checker.push(i) for i in ids]
    assert [r for _, r in out] == [None] * (len(ids) - 1) + ["length"]
    assert "".join(d for d, _ in out) == "Hello Qu"  # "Qu" was held, then released at the end


def test_push_after_finish_is_a_bug(tok: Tokenizer) -> None:
    checker = StopChecker(tok, SamplingParams(max_tokens=1))
    checker.push(tok.encode("a", add_special_tokens=False)[0])
    with pytest.raises(AssertionError):
        checker.push(5)
