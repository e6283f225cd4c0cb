"""Continuous-batching scheduler: decides which sequences run this step and how many tokens each.

It never touches tensors: it works with token counts and asks the paged KV cache for pages.
Each step:
  1. running sequences first — decodes (1 token) before prefill continuations — so a step never
     stalls the sequences already generating. Each gets the pages its tokens need, appended as it
     grows (no max_tokens reservation). When no page is free (or cached, evictable), the newest
     running sequence (by admission) is preempted: its pages are released and it goes back to the
     front of the queue to be recomputed from its longest cached prefix, so its output is the same
     as an uninterrupted run's. A sequence that is itself the newest is the one preempted;
  2. then waiting sequences in FIFO order while the batch is under the policy's sequence cap and
     the token budget lasts; a long prompt gets only the budget that is left (chunked prefill).
     A new sequence starts from the longest cached prefix of its prompt and needs pages only for
     its first chunk, with a small headroom left for the running ones' next pages. If there is no
     room the head of the queue is held (nobody overtakes it, so nobody starves); nobody is
     admitted in a step that had to preempt.
`preempt` is also what the engine calls when a forward runs out of device memory elsewhere.
Under `scheduling_policy="priority"` (runtime.engine.priority) the queue is ordered by priority
(lower first, FIFO within one, with aging) before admission, the victim is the lowest-priority
running sequence instead of the newest, and a held head preempts a lower-priority running one.

The scheduler owns the KV bookkeeping (as vLLM's scheduler and nano-vllm's do): `schedule()`
takes pages (a new sequence's only once `probe` says they are there: admission never allocates
and frees again), `update_from_output()` moves the cursors over what the forward wrote and
publishes the pages it filled for prefix reuse, `finish` / `preempt` free. A sequence's one token
cursor is its KV's (`Sequence.num_computed_tokens` reads it). `make_stats()` describes a step.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import replace

from runtime.engine.fair_share import FairShare
from runtime.engine.preemption import Preemption
from runtime.engine.priority import PriorityPolicy
from runtime.engine.scheduled import (
    KVSpace,
    ScheduledSeq,
    SchedulerConfig,
    SchedulerOutput,
    Speculator,
)
from runtime.engine.sequence import Sequence, SequenceStatus
from runtime.engine.stats import RequestEvent, StepStats
from runtime.memory.stats import KVCacheStats


class Scheduler(Preemption):
    """Preemption and forks (which requeue a sequence) in preemption.py."""

    def __init__(self, config: SchedulerConfig, kv: KVSpace) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last one is the newest
        self.num_queued_tokens = 0  # prompt tokens in `waiting`
        self.num_queued_forks = 0  # choices waiting on a queued sequence's prefill (n > 1)
        self.num_holds = 0  # steps whose queue head found no KV room
        self.num_preemptions = 0
        self._num_admitted = 0
        self.priority: PriorityPolicy | None = None  # None: FIFO queue, newest preempted
        if config.scheduling_policy == "priority":
            self.priority = PriorityPolicy(config.priority_aging_s)
        self.speculator: Speculator | None = None  # speculative decoding configured (spec/)

    @property
    def num_waiting(self) -> int:
        """Sequences waiting: each choice of a request with n > 1 counts."""
        return len(self.waiting) + self.num_queued_forks

    @property
    def num_running(self) -> int:
        return len(self.running)

    def admission_refusal(self, num_prompt_tokens: int, num_seqs: int = 1) -> str | None:
        """Why a new request cannot join the waiting queue now, or None if it can. A request
        with n choices counts as n sequences (its prompt's tokens once: one prefill)."""
        if self.num_waiting + num_seqs > max(self.config.max_queued_requests, num_seqs):
            return f"waiting queue is full ({self.config.max_queued_requests} requests)"
        if self.num_queued_tokens + num_prompt_tokens > self.config.max_queued_tokens:
            return f"waiting queue holds too many tokens ({self.num_queued_tokens} queued)"
        return None

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        seq.arrival_index = self._num_admitted
        self._num_admitted += 1
        self.waiting.append(seq)
        self.num_queued_forks += len(seq.pending_forks)
        self.num_queued_tokens += seq.num_prompt_tokens

    def kv_stats(self) -> KVCacheStats:
        return replace(self.kv.stats(), num_preemptions=self.num_preemptions)

    def schedule(self, max_num_seqs: int) -> SchedulerOutput:
        out = SchedulerOutput()
        # decodes first (pending == 1), then running prefill chunks; sort is stable (FIFO inside)
        for seq in sorted(self.running, key=lambda s: s.num_pending_tokens > 1):
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_tokens = min(seq.num_pending_tokens, self._budget_left(out))
            if num_tokens > 0 and self._make_room(out, seq, num_tokens):
                self._take(out, seq, num_tokens)
        budget = self._budget_left(out)  # a preempted victim's tokens are back in it
        if self.priority is not None:
            self.priority.order(self.waiting, time.time())
        share = self._fair_share(max_num_seqs) if budget > 0 and not out.num_preempted else None
        while (
            self.waiting
            and budget > 0
            and len(self.running) < max_num_seqs
            and not out.num_preempted
        ):
            if share is not None:
                share.bring_forward(self.waiting)
            seq = self.waiting[0]
            if self.running and len(self.running) + seq.num_seqs > max_num_seqs:
                break  # its choices would overrun the batch cap (alone, it may start)
            if share is not None and share.is_over_share(seq):
                break  # the least-served waiting group has its share: the rest wait too
            admitted = self._admit(seq, budget)
            if admitted is None:
                self.num_holds += 1
                if self.priority is not None:
                    self._preempt_for(out, seq)
                break  # hold the head: FIFO order, no overtaking
            if share is not None:
                share.admitted(seq)
            budget -= admitted
            self._take(out, seq, admitted)
        out.batch_size_limit = max_num_seqs
        out.limit_binds = self.num_waiting > 0 and self.num_running >= max_num_seqs
        head = self.waiting[0] if out.limit_binds and self.waiting else None
        # a head never admitted yet waits for a place in the batch (one clock read, only then);
        # a preempted sequence or a fork back in the queue waits for KV pages, which a larger
        # limit would not give it
        if head is not None and head.stats.scheduled_ts is None:
            out.queue_wait_s = max(0.0, time.time() - head.stats.queued_ts)
        out.num_attention_pairs = sum(
            item.num_new_tokens * item.seq.num_computed_tokens
            + item.num_new_tokens * (item.num_new_tokens + 1) // 2
            for item in out.items
        )
        # a step with a LoRA row drafts nothing: verification runs the base forward only
        if self.speculator is not None and out.items and not out.num_lora:
            self.speculator.plan(out, self._budget_left(out))
        return out

    def _fair_share(self, max_num_seqs: int) -> FairShare | None:
        """The running sequences per group and tenant (runtime.engine.fair_share); None when
        nobody can be admitted this step anyway."""
        if not self.waiting or len(self.running) >= max_num_seqs:
            return None
        if not self.running and len(self.waiting) == 1:
            return None  # one request and an idle batch: it may always start, nothing to order
        policy, now = self.priority, time.time()
        key = None if policy is None else (lambda seq: policy.key(seq, now)[0])
        return FairShare(self.config.share, self.running, max_num_seqs, key)

    def _budget_left(self, out: SchedulerOutput) -> int:
        return self.config.max_num_batched_tokens - out.num_prefill_tokens - out.num_decode_tokens

    def _make_room(self, out: SchedulerOutput, seq: Sequence, num_tokens: int) -> bool:
        """Pages for `num_tokens` more of a running sequence, preempting the newest running ones
        (unscheduling them if this step already took them) until there are; False when `seq`
        itself was preempted."""
        assert seq.kv is not None
        while not self.kv.ensure(seq.kv, num_tokens):
            victim = self.running[-1]
            if self.priority is not None:  # the lowest priority, not the newest
                victim = self.priority.victim(self.running, time.time())
            self._preempt_taken(out, victim)
            if victim is seq:
                return False
        return True

    def _admit(self, seq: Sequence, budget: int) -> int | None:
        """Start the queue head: KV from its longest cached prefix plus pages for its first
        chunk. The tokens of that chunk, or None (nothing taken) when there is no room."""
        ids, salt = seq.cache_lookup_ids, seq.request.cache_salt
        prefix = self.kv.probe(ids, salt)
        num_tokens = min(seq.num_tokens - prefix.num_tokens, budget)
        wanted = (
            seq.kv_capacity if self.config.reserve_full_sequence else prefix.num_tokens + num_tokens
        )
        need = self.kv.pages_for(wanted) - prefix.num_held_pages  # a partial page is taken
        # the running sequences' next pages come first: leave a little headroom for them (none
        # needed when every sequence got all its pages up front)
        headroom = min(len(self.running), max(1, self.kv.num_pages // 100))
        if self.config.reserve_full_sequence:
            headroom = 0
        if need + headroom > self.kv.num_available_pages() - prefix.num_idle_pages:
            return None  # nothing was taken
        kv = self.kv.allocate(seq.request_id, ids, salt=salt)
        if not self.kv.ensure(kv, wanted - kv.num_tokens):  # the probe said there is room
            self.kv.free(seq.request_id)
            raise RuntimeError(f"KV probe and allocation disagree for {seq.request_id}")
        self.waiting.popleft()
        self.num_queued_forks -= len(seq.pending_forks)
        self.num_queued_tokens -= seq.num_prompt_tokens
        if seq.stats.scheduled_ts is None:  # first schedule: the prompt's prefix-cache lookup
            self.kv.count_prefix_query(seq.num_prompt_tokens, kv.num_cached_tokens)
            seq.stats.cached_tokens = kv.num_cached_tokens
        seq.kv, seq.status = kv, SequenceStatus.RUNNING
        bisect.insort(self.running, seq, key=lambda s: s.arrival_index)
        seq.mark(RequestEvent.SCHEDULED)
        return num_tokens

    def _take(self, out: SchedulerOutput, seq: Sequence, num_tokens: int) -> None:
        out.items.append(ScheduledSeq(seq, num_tokens))
        out.num_featured += seq.features is not None
        out.num_random += not seq.request.sampling.is_greedy
        if seq.features is not None and seq.features.lora is not None:
            out.num_lora += 1
        if self._is_decode(seq, num_tokens):
            out.num_decode_tokens += 1
        else:
            out.num_prefill_tokens += num_tokens

    @staticmethod
    def _is_decode(seq: Sequence, num_tokens: int) -> bool:
        return num_tokens == 1 and seq.num_pending_tokens == 1 and bool(seq.output_token_ids)

    def update_from_output(self, batch: SchedulerOutput) -> None:
        """After a forward that succeeded: each cursor moves over the tokens it wrote, and the
        pages they filled are published for prefix reuse; a sequence closed while its forward
        ran (cancelled, timed out) is freed now (the forward was still writing into it)."""
        for item in batch.items:
            seq = item.seq
            if seq.is_closed:
                self.finish(seq)
                continue
            assert seq.kv is not None
            seq.kv.advance(item.num_new_tokens)
            self.kv.cache_full_pages(seq.kv, seq.token_slice)

    def make_stats(
        self,
        batch: SchedulerOutput,
        *,
        step_id: int,
        num_sampled: int,
        busy_s: float,
        started_ts: float,
        model: str,
        version: str,
    ) -> StepStats:
        """The step as the sinks see it; queue and KV figures as they stand after its update."""
        return StepStats(
            ts=time.time(),
            step_id=step_id,
            num_seqs=len(batch.items),
            num_prefill_tokens=batch.num_prefill_tokens,
            num_decode_tokens=batch.num_decode_tokens,
            num_sampled=num_sampled,
            busy_seconds=busy_s,
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            batch_size_limit=batch.batch_size_limit,
            request_ids=tuple(item.seq.request_id for item in batch.items),
            started_ts=started_ts,
            model=model,
            version=version,
            num_attention_pairs=batch.num_attention_pairs,
            limit_binds=batch.limit_binds,
            queue_wait_s=batch.queue_wait_s,
            kv=self.kv_stats(),
            num_draft_tokens=batch.num_draft_tokens,
            num_accepted_tokens=batch.num_accepted_tokens,
            num_emitted_tokens=batch.num_emitted_tokens,
            spec_method="" if self.speculator is None else self.speculator.method,
        )

    def finish(self, seq: Sequence) -> None:
        """Take a sequence out (finished, cancelled, failed) and free its KV at once."""
        if seq.status is SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
            self.num_queued_forks -= len(seq.pending_forks)
            self.num_queued_tokens -= seq.num_prompt_tokens
        elif seq.status is SequenceStatus.RUNNING and seq in self.running:
            self.running.remove(seq)
        seq.status = SequenceStatus.FINISHED
        self._free(seq)

    def _free(self, seq: Sequence) -> None:
        if seq.kv is not None:
            seq.kv = None
            self.kv.free(seq.request_id)
