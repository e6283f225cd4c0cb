"""Fair share of the batch (issue 39, item 5: one body of 32 prompts × n 8 held the engine 58 s
and a 4-token chat sent meanwhile waited 49.6 s behind its queued prompts).

Two rules, applied by the scheduler only when it is about to admit from a waiting queue:
1. order: the waiting sequences go least-served first: a preempted sequence (it ran before)
   first, then by the running sequences of its tenant, then of its group (the API request it
   belongs to: a batch's prompts share one), then arrival. A chat from a client with nothing
   running goes ahead of the 200th prompt of someone else's batch; with one tenant, ahead of the
   rest of its own batch. Stable, so with one group it is the plain FIFO order.
2. share: a group (and a tenant) holds at most `max_request_share` (`max_tenant_share`) of the
   step's sequence cap while it has sequences running, so a slot stays free for the next
   request instead of waiting for the whole batch to end. A group with nothing running may
   always start (alone, it may fill the batch).
Cost: one pass over the running sequences per step that admits and one over the waiting ones per
admission; nothing on a step that admits nobody.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from runtime.engine.sequence import Sequence

__all__ = ["FairShare", "ShareConfig", "group_of"]


@dataclass(frozen=True)
class ShareConfig:
    max_request_share: float = 1.0  # of the step's sequence cap, per group; 1.0: no bound
    max_tenant_share: float = 1.0  # the same per tenant


def group_of(seq: Sequence) -> str:
    return seq.request.group or seq.request.request_id


def _tenant_of(seq: Sequence) -> str:
    return seq.request.tenant or seq.request.cache_salt


class FairShare:
    """The running sequences per group and tenant as one step's admissions go."""

    def __init__(
        self,
        config: ShareConfig,
        running: Iterable[Sequence],
        max_num_seqs: int,
        priority: Callable[[Sequence], float] | None = None,
    ):
        # the priority policy's key (runtime.engine.priority, aging included) ranks first; None
        # (fcfs): a request's `priority` field is not read at all
        self._priority = priority
        self.groups: Counter[str] = Counter()
        self.tenants: Counter[str] = Counter()
        for seq in running:
            self.groups[group_of(seq)] += 1
            self.tenants[_tenant_of(seq)] += 1
        self.group_cap = max(1, int(config.max_request_share * max_num_seqs))
        self._scanned = False  # bring_forward: the queue was scanned this step
        self._last_group = ""  # the group admitted last
        self.tenant_cap = max(1, int(config.max_tenant_share * max_num_seqs))

    def bring_forward(self, waiting: deque[Sequence]) -> None:
        """The least-served waiting sequence (rule 1) to the head, the others in their order.
        Called before each admission, as the counts move with it: after one prompt of a batch
        starts, the next request's turn comes before the batch's next prompt. The queue is
        scanned at a step's first admission, then again only when the new head is of the group
        just admitted (a queue of independent requests costs one scan a step)."""
        if len(waiting) < 2:
            return
        head = waiting[0]
        if self._scanned and group_of(head) != self._last_group:
            return
        self._scanned = True
        head_rank = self._rank(head)
        if head_rank[1] == 0 or head_rank[2:4] == (0, 0):
            # nothing ranks before a returning sequence, or one of an idle client: the head
            # already holds the lowest priority key (fcfs: all equal; priority: the queue was
            # ordered by the policy just before)
            return
        best, best_rank, previous = head, head_rank, head.request.group
        for seq in waiting:
            group = seq.request.group
            if group is not None and group == previous:
                continue  # the next prompt of the same batch: it ranks after the one before
            previous = group
            rank = self._rank(seq)
            if rank < best_rank:  # strictly: the first of equals, FIFO among them
                best, best_rank = seq, rank
        if best is not head:
            waiting.remove(best)
            waiting.appendleft(best)

    def _rank(self, seq: Sequence) -> tuple[float, int, int, int, int]:
        ran_before = seq.stats.scheduled_ts is not None  # preempted: back first, as before
        priority = 0.0 if self._priority is None else self._priority(seq)  # lower first
        return (
            priority,
            0 if ran_before else 1,
            self.tenants[_tenant_of(seq)],
            self.groups[group_of(seq)],
            seq.arrival_index,
        )

    def is_over_share(self, seq: Sequence) -> bool:
        """Rule 2: admitting `seq` (its choices too) would pass its group's or tenant's share.
        A preempted sequence only comes back: never held by its share."""
        if seq.stats.scheduled_ts is not None:
            return False
        group, tenant = self.groups[group_of(seq)], self.tenants[_tenant_of(seq)]
        if group and group + seq.num_seqs > self.group_cap:
            return True
        return bool(tenant) and tenant + seq.num_seqs > self.tenant_cap

    def admitted(self, seq: Sequence) -> None:
        self._last_group = group_of(seq)
        self.groups[group_of(seq)] += seq.num_seqs
        self.tenants[_tenant_of(seq)] += seq.num_seqs
