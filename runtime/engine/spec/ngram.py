"""Prompt lookup (n-gram) drafting: the tokens that followed the most recent earlier occurrence
of the sequence's last n tokens, for the longest n in [ngram_min, ngram_max] that has one.

Pure Python over token ids (the scheduler calls it, and the scheduler never touches tensors).
It pays where the output repeats its context (quoting, summaries, code edits, JSON); elsewhere it
usually finds nothing and the row decodes as usual, at the cost of the lookup.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["propose_ngram"]

# how far back the lookup scans: a bound on its cost per row and step (a long context is
# searched from its end, where a continuation is most likely to repeat)
MAX_LOOKBACK = 2048


def propose_ngram(token_ids: Sequence[int], k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """Up to `k` drafted tokens continuing `token_ids`; [] when no n-gram of the window recurs."""
    num = len(token_ids)
    start = max(0, num - MAX_LOOKBACK)
    window = list(token_ids[start:])
    size = len(window)
    for n in range(min(ngram_max, size - 1), ngram_min - 1, -1):
        suffix = window[size - n :]
        first = suffix[0]
        # the most recent earlier match: scan right to left, the suffix itself excluded
        for i in range(size - n - 1, -1, -1):
            if window[i] == first and window[i : i + n] == suffix:
                follow = window[i + n : i + n + k]
                if follow:
                    return follow
    return []
