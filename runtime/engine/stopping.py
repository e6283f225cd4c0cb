"""When a sequence stops, and what text it may emit so far.

`StopChecker.push(token_id)` returns `(delta, finished_reason)`:
- eos (unless `ignore_eos`) or one of `stop_token_ids` -> "stop"; that token's text is not emitted;
- a stop string appearing in the text -> "stop"; the text from the stop string on is not emitted;
- `max_tokens` completion tokens -> "length".
Text that could still turn into a stop string (a suffix equal to a stop string's prefix) is held
back until the next tokens decide it, so a stop string split over several tokens is never
partly emitted. When the sequence finishes for another reason the held text is released.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.engine.sampling import SamplingParams
from runtime.engine.stats import FinishReason
from runtime.models.tokenizer import IncrementalDecoder, Tokenizer

__all__ = ["StopChecker"]


class StopChecker:
    def __init__(
        self, tokenizer: Tokenizer, params: SamplingParams, prompt_ids: Sequence[int] = ()
    ) -> None:
        self.params = params
        self.decoder = IncrementalDecoder(tokenizer, prompt_ids)
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids.update(tokenizer.eos_token_ids)
        self.stop_token_ids = frozenset(stop_ids)
        self.num_tokens = 0  # completion tokens pushed so far
        self.held = ""  # decoded text not yet emitted (may be the start of a stop string)
        self.finished_reason: FinishReason | None = None

    def push(self, token_id: int) -> tuple[str, FinishReason | None]:
        assert self.finished_reason is None, "push after the sequence finished"
        self.num_tokens += 1
        if token_id in self.stop_token_ids:
            return self._finish(FinishReason.STOP, self.held + self.decoder.flush())
        text = self.held + self.decoder.push(token_id)
        cut = self._find_stop(text)
        if cut is not None:
            return self._finish(FinishReason.STOP, text[:cut])
        if self.num_tokens >= self.params.max_tokens:
            return self._finish(FinishReason.LENGTH, text + self.decoder.flush())
        keep = self._held_suffix_len(text)
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep], None

    def _finish(self, reason: FinishReason, text: str) -> tuple[str, FinishReason | None]:
        self.finished_reason = reason
        self.held = ""
        return text, reason

    def _find_stop(self, text: str) -> int | None:
        """Index where the earliest stop string starts in `text`, if any."""
        hits = [i for i in (text.find(s) for s in self.params.stop) if i >= 0]
        return min(hits) if hits else None

    def _held_suffix_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        best = 0
        for stop in self.params.stop:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
