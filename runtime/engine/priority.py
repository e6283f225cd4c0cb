"""Priority scheduling (`scheduling_policy=priority`, vLLM's semantics): a request's `priority`
orders the waiting queue (lower runs first; FIFO within a priority) and picks whom to preempt
(the lowest-priority running sequence, the newest among equals), and a waiting request preempts
a lower-priority running one when there is no page for it. Under the default `fcfs` policy
nothing here runs: the scheduler keeps its plain FIFO queue and newest-first preemption.

Aging keeps low priorities from starving: a sequence's effective priority drops by one level per
`aging_s` seconds since it was queued (`RequestStats.queued_ts`, kept across preemptions), so
any request waits at most about (its priority - the best one) x aging_s behind later arrivals.
Running sequences age the same way (from when they were queued), so a long-running one is
protected from preemption by newer requests of a better priority in the same measure.

    key(seq) = (priority - waited_s / aging_s, arrival_index)    smaller key: runs first
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from runtime.engine.sequence import Sequence

__all__ = ["PriorityPolicy"]


@dataclass(frozen=True)
class PriorityPolicy:
    aging_s: float  # seconds waited per priority level gained; 0: no aging

    def key(self, seq: Sequence, now: float) -> tuple[float, int]:
        """Smaller runs first: the aged priority, then admission order (FIFO within one)."""
        level = float(seq.request.priority)
        if self.aging_s > 0.0:
            level -= max(0.0, now - seq.stats.queued_ts) / self.aging_s
        return (level, seq.arrival_index)

    def order(self, waiting: deque[Sequence], now: float) -> None:
        """Sort the waiting queue in place, best key first (a preempted sequence keeps its
        arrival index, so it goes back to its place among its priority)."""
        if len(waiting) < 2:
            return
        ordered = sorted(waiting, key=lambda s: self.key(s, now))
        waiting.clear()
        waiting.extend(ordered)

    def victim(self, running: Seq[Sequence], now: float) -> Sequence:
        """Whom to preempt when a running sequence needs a page: the worst key."""
        return max(running, key=lambda s: self.key(s, now))

    def victim_for(self, seq: Sequence, running: Seq[Sequence], now: float) -> Sequence | None:
        """A running sequence of strictly lower (aged) priority than waiting `seq`, to preempt
        so `seq` gets its pages; None when every running one ranks at least as high."""
        if not running:
            return None
        worst = self.victim(running, now)
        return worst if self.key(worst, now)[0] > self.key(seq, now)[0] else None
