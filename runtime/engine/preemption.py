"""The scheduler's verbs that put a running sequence back in the queue, off a plain request's
path: preemption (no KV page left for a running sequence, a higher-priority head, a forward out of
device memory) and forks (n > 1 choices; a fork with no page is queued like a preempted
sequence). `Scheduler` (scheduler.py, whose docstring has the policy) inherits them.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from typing import TYPE_CHECKING

from runtime.engine.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from runtime.engine.priority import PriorityPolicy
    from runtime.engine.scheduled import KVSpace, ScheduledSeq, SchedulerOutput


class Preemption:
    kv: KVSpace
    waiting: deque[Sequence]
    running: list[Sequence]
    num_queued_tokens: int
    num_queued_forks: int
    num_preemptions: int
    priority: PriorityPolicy | None

    if TYPE_CHECKING:  # defined by Scheduler

        def _free(self, seq: Sequence) -> None: ...

        @staticmethod
        def _is_decode(seq: Sequence, num_tokens: int) -> bool: ...

    def _preempt_taken(self, out: SchedulerOutput, victim: Sequence) -> None:
        """Preempt a running sequence, unscheduling it if this step already took it."""
        for item in out.items:
            if item.seq is victim:
                self._untake(out, item)
                break
        self.preempt(victim)
        out.num_preempted += 1

    def _preempt_for(self, out: SchedulerOutput, seq: Sequence) -> None:
        """Priority policy: the waiting head found no room; a running sequence of lower priority
        gives up its pages (the head is admitted next step, ahead of the victim)."""
        assert self.priority is not None
        victim = self.priority.victim_for(seq, self.running, time.time())
        if victim is not None:
            self._preempt_taken(out, victim)

    def _untake(self, out: SchedulerOutput, item: ScheduledSeq) -> None:
        out.items.remove(item)
        out.num_featured -= item.seq.features is not None
        out.num_random -= not item.seq.request.sampling.is_greedy
        if item.seq.features is not None and item.seq.features.lora is not None:
            out.num_lora -= 1
        if self._is_decode(item.seq, item.num_new_tokens):
            out.num_decode_tokens -= 1
        else:
            out.num_prefill_tokens -= item.num_new_tokens

    def preempt(self, seq: Sequence) -> None:
        """Free a running sequence's KV and requeue it at the front for recompute."""
        self.running.remove(seq)
        self._free(seq)  # its cursor with it: num_computed_tokens reads 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_queued_forks += len(seq.pending_forks)
        self.num_queued_tokens += seq.num_prompt_tokens

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Start a choice of `parent`'s request right after its prefill, sharing its page table
        (runtime.engine.choices); with no page for the fork it is queued at the front like a
        preempted sequence, to recompute from the prefix cache."""
        assert parent.kv is not None
        child.arrival_index = parent.arrival_index
        child.stats.scheduled_ts = parent.stats.scheduled_ts  # no second prefix-cache query
        kv = self.kv.fork(parent.kv, child.request_id)
        if kv is None:
            child.status = SequenceStatus.WAITING
            self.waiting.appendleft(child)
            self.num_queued_tokens += child.num_prompt_tokens
            return
        child.kv, child.status = kv, SequenceStatus.RUNNING
        bisect.insort(self.running, child, key=lambda s: s.arrival_index)
