"""Continuous-batching scheduler: decides which sequences run this step and how many tokens each.

It never touches tensors: it works with token counts and asks the KV space for room. Each step:
  1. running sequences first — decodes (1 token) before prefill continuations — so a step never
     stalls the sequences already generating;
  2. then waiting sequences in FIFO order while the batch is under the policy's sequence cap and
     the token budget lasts; a long prompt gets only the budget that is left (chunked prefill).
A new sequence reserves KV for its whole life (prompt + max_tokens) when it is first scheduled.
If the KV space has no room the head of the queue is held (nobody overtakes it, so nobody starves)
until running sequences finish and free theirs; a running sequence therefore never runs out of KV.
`preempt` (free the KV, requeue at the front for recompute) is for device memory running out
elsewhere (the engine calls it when a forward hits out-of-memory).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import torch  # only for torch.OutOfMemoryError: the scheduler never touches tensors

from runtime.engine.sequence import Sequence, SequenceStatus
from runtime.engine.stats import RequestEvent
from runtime.memory.kv_cache import SequenceKV


class KVSpace(Protocol):
    def allocate(self, seq_id: str, num_tokens: int) -> SequenceKV | None: ...
    def free(self, seq_id: str) -> None: ...


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int  # per-step token budget (prefill chunks + decodes)
    max_queued_requests: int  # bound of the waiting queue
    max_queued_tokens: int  # bound of the prompt tokens waiting in it


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # feed seq.token_ids[num_computed : num_computed + num_new_tokens]

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the known tokens, so a new token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    items: list[ScheduledSeq] = field(default_factory=list)
    num_prefill_tokens: int = 0  # tokens fed by sequences still in (chunked) prefill
    num_decode_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.items


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVSpace) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_queued_tokens = 0  # prompt tokens in `waiting`
        self.num_holds = 0  # steps whose queue head found no KV room

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def admission_refusal(self, num_prompt_tokens: int) -> str | None:
        """Why a new request cannot join the waiting queue now, or None if it can."""
        if len(self.waiting) >= self.config.max_queued_requests:
            return f"waiting queue is full ({self.config.max_queued_requests} requests)"
        if self.num_queued_tokens + num_prompt_tokens > self.config.max_queued_tokens:
            return f"waiting queue holds too many tokens ({self.num_queued_tokens} queued)"
        return None

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        self.num_queued_tokens += seq.num_prompt_tokens

    def schedule(self, max_num_seqs: int) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        # decodes first (pending == 1), then running prefill chunks; sort is stable (FIFO inside)
        for seq in sorted(self.running, key=lambda s: s.num_pending_tokens > 1):
            budget -= self._take(out, seq, budget)
        while self.waiting and budget > 0 and len(self.running) < max_num_seqs:
            seq = self.waiting[0]
            try:
                kv = self.kv.allocate(seq.request_id, seq.kv_capacity)
            except torch.OutOfMemoryError:  # the device is fuller than the KV budget assumed
                kv = None
            if kv is None:
                self.num_holds += 1
                break  # hold the head: FIFO order, no overtaking
            self.waiting.popleft()
            self.num_queued_tokens -= seq.num_prompt_tokens
            seq.kv, seq.status = kv, SequenceStatus.RUNNING
            seq.num_computed_tokens = 0
            self.running.append(seq)
            seq.mark(RequestEvent.SCHEDULED)
            budget -= self._take(out, seq, budget)
        return out

    def _take(self, out: SchedulerOutput, seq: Sequence, budget: int) -> int:
        num_tokens = min(seq.num_pending_tokens, budget)
        if num_tokens <= 0:
            return 0
        out.items.append(ScheduledSeq(seq, num_tokens))
        if seq.num_pending_tokens == 1 and seq.output_token_ids:
            out.num_decode_tokens += 1
        else:
            out.num_prefill_tokens += num_tokens
        return num_tokens

    def finish(self, seq: Sequence) -> None:
        """Take a sequence out (finished, cancelled, failed) and free its KV at once."""
        if seq.status is SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
            self.num_queued_tokens -= seq.num_prompt_tokens
        elif seq.status is SequenceStatus.RUNNING and seq in self.running:
            self.running.remove(seq)
        seq.status = SequenceStatus.FINISHED
        self._free(seq)

    def preempt(self, seq: Sequence) -> None:
        """Free a running sequence's KV and requeue it at the front for recompute."""
        self.running.remove(seq)
        self._free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_queued_tokens += seq.num_prompt_tokens

    def _free(self, seq: Sequence) -> None:
        if seq.kv is not None:
            seq.kv = None
            self.kv.free(seq.request_id)
