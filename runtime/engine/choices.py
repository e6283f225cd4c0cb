"""`n` and `best_of`: several sequences (choices) over one prompt, one prefill, forked page tables.

A request whose SamplingParams run more than one sequence becomes one `ChoiceGroup`. Choice 0 is
an ordinary sequence in the queue; the other choices wait on it (`Sequence.pending_forks`, counted
by admission as sequences of their own) until its prefill ends. The step that samples choice 0's
first token samples theirs from the same logits row, each with its own generator (seed + index),
and the scheduler forks choice 0's page table for each (`KVCache.fork`: full pages shared by
refcount, the partial last page copied). A choice the pool has no page for is queued like a
preempted sequence instead and recomputes prompt + its first token from the prefix cache.

One request keeps one handle (outputs tagged with their `index`; it ends with the last choice's
final output) and one stats record, taken when the last choice closes, with the completion tokens
of every choice summed. A cancel, timeout or failure of one choice ends them all (the core).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from runtime.engine.choice_group import ChoiceGroup, ChoiceState
from runtime.engine.features import SeqFeatures
from runtime.engine.sequence import Sequence
from runtime.engine.stats import RequestStats

__all__ = ["ChoiceGroup", "make_choices"]


def make_choices(first: Sequence, build: Callable[[int, RequestStats], Sequence]) -> None:
    """Attach the request's other choices to `first` (choice 0): `build(index, stats)` makes
    choice `index` with its own stats (a copy: only choice 0's record is emitted). Called only
    for a request with more than one sequence."""
    num_seqs = first.request.sampling.num_seqs
    children = [build(i, replace(first.stats, events=[])) for i in range(1, num_seqs)]
    group = ChoiceGroup(members=[first, *children], num_open=num_seqs)
    for i, seq in enumerate(group.members):
        if seq.features is None:
            seq.features = SeqFeatures()
        seq.features.choice = ChoiceState(index=i, group=group)
    assert first.features is not None and first.features.choice is not None
    first.features.choice.pending_forks = children
