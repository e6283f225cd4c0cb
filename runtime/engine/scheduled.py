"""What the scheduler hands the rest of the step: the batch it chose (`SchedulerOutput`, one
`ScheduledSeq` per row), its settings, and the two protocols it is written against (the paged
KV cache's verbs, speculative decoding's planner). Kept apart from scheduler.py so the runner,
the post-processing and the features' step code read the batch without importing the policy.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Protocol

from runtime.engine.fair_share import ShareConfig
from runtime.engine.sequence import Sequence
from runtime.memory.kv_pool import PrefixProbe, SequenceKV, TokenSlice
from runtime.memory.stats import KVCacheStats


class KVSpace(Protocol):
    """The verbs of runtime.memory.kv_cache.KVCache the scheduler uses."""

    @property
    def num_pages(self) -> int: ...

    def probe(self, token_ids: Seq[int], salt: str = "") -> PrefixProbe: ...
    def allocate(self, seq_id: str, token_ids: Seq[int], salt: str = "") -> SequenceKV: ...
    def ensure(self, kv: SequenceKV, num_new_tokens: int) -> bool: ...
    def fork(self, parent: SequenceKV, seq_id: str) -> SequenceKV | None: ...
    def pages_for(self, num_tokens: int) -> int: ...
    def num_available_pages(self) -> int: ...
    def count_prefix_query(self, num_tokens: int, num_hit_tokens: int) -> None: ...
    def cache_full_pages(self, kv: SequenceKV, tokens: TokenSlice) -> None: ...
    def free(self, seq_id: str) -> None: ...
    def stats(self) -> KVCacheStats: ...
    def trim(self, kv: SequenceKV, num_tokens: int) -> None: ...


class Speculator(Protocol):
    """Speculative decoding's side of the scheduler (runtime.engine.spec.planner.Speculator):
    drafts and their pages at the end of `schedule`, the rollback after the update."""

    @property
    def method(self) -> str: ...

    def plan(self, out: SchedulerOutput, budget_left: int) -> None: ...
    def settle(
        self,
        batch: SchedulerOutput,
        seq: Sequence,
        num_drafted: int,
        num_accepted: int,
        num_emitted: int,
    ) -> None: ...


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int  # per-step token budget (prefill chunks + decodes)
    max_queued_requests: int  # bound of the waiting queue
    max_queued_tokens: int  # bound of the prompt tokens waiting in it
    # benchmark only (bench.kv): emulate the pre-paging policy, pages for prompt + max_tokens
    # taken when a sequence is first scheduled
    reserve_full_sequence: bool = False
    # "fcfs" | "priority": requests' `priority` orders the queue and preemption (priority.py)
    scheduling_policy: str = "fcfs"
    priority_aging_s: float = 10.0  # priority policy: seconds waited per level gained
    share: ShareConfig = field(default_factory=ShareConfig)  # runtime.engine.fair_share


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # feed seq.token_ids[num_computed : num_computed + num_new_tokens]
    # speculative decoding (runtime.engine.spec): tokens fed after the new one, to be verified
    draft_token_ids: list[int] | None = None

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the known tokens, so a new token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    items: list[ScheduledSeq] = field(default_factory=list)
    num_prefill_tokens: int = 0  # tokens fed by sequences still in (chunked) prefill
    num_decode_tokens: int = 0
    num_preempted: int = 0  # sequences preempted while making this step
    batch_size_limit: int = 0  # the sequence cap this step was scheduled under
    # requests left waiting with the batch at the cap: the cap, not the queue, bound the step
    limit_binds: bool = False
    queue_wait_s: float = 0.0  # with limit_binds: the head of the queue's wait (StepStats)
    # sum over items of the (query, key) pairs its new tokens attend: taken at schedule time,
    # before the update moves the cursors (see StepStats)
    num_attention_pairs: int = 0
    # counted as each sequence is taken, so the step's sampling batch knows what it holds without
    # a pass over the rows: sequences with a features slot, and sequences not sampled greedily
    num_featured: int = 0
    num_random: int = 0
    # speculative decoding (runtime.engine.spec): drafted tokens fed this step (counted in
    # num_prefill_tokens too: a drafting row is a 1 + k token chunk), and after the update, how
    # many the target accepted and how many tokens the drafting rows emitted
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0
    num_lora: int = 0  # sequences with a LoRA adapter: 0 = the step runs no LoRA code at all

    @property
    def is_plain(self) -> bool:
        """No row with a feature, every row greedy: the sampling batch is one argmax."""
        return self.num_featured == 0 and self.num_random == 0

    @property
    def is_empty(self) -> bool:
        return not self.items
