"""Per-request state inside the engine: one `Sequence` per admitted request.

Token accounting (the scheduler reasons only with these counts, never with tensors):
    token_ids          = prompt_token_ids + output_token_ids
    num_computed_tokens  tokens whose K/V are in `kv`: the KV's own cursor (0 without KV), one
                         count for one fact; starts at the cached prefix the KV cache found when
                         the sequence was scheduled, moved by the scheduler after each forward
    num_pending_tokens   token_ids[num_computed_tokens:], what the next steps must feed the model
A step that feeds the last pending token samples the next one; a step that feeds a prefix of a
long prompt (a prefill chunk) samples nothing. A preempted sequence drops its KV and recomputes
prompt + outputs (from its longest cached prefix), which the same counts describe.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runtime.engine.request import GenerationRequest, RequestHandle, TokenLogprob
from runtime.engine.stats import RequestEvent, RequestStats

if TYPE_CHECKING:
    import torch

    from runtime.engine.choice_group import ChoiceGroup
    from runtime.engine.constraints.state import ConstraintState
    from runtime.engine.stopping import StopChecker
    from runtime.memory.kv_cache import SequenceKV


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request: GenerationRequest
    handle: RequestHandle
    stats: RequestStats
    deadline: float  # time.monotonic() after which the request fails with RequestTimeout
    stop_checker: StopChecker
    generator: torch.Generator | None = None  # per-request seeded sampling state
    output_token_ids: list[int] = field(default_factory=list)
    kv: SequenceKV | None = None
    status: SequenceStatus = SequenceStatus.WAITING
    num_preemptions: int = 0
    arrival_index: int = -1  # admission order (the scheduler's); kept across preemptions
    is_closed: bool = False  # the handle got its final output; the engine is done with it
    # runtime.verify: sampled for verification at admission; the runner then keeps the logit of
    # each token it samples for this request (the last one is the final step's)
    is_verified: bool = False
    chosen_logit: float | None = None
    # n / best_of (runtime.engine.choices): the choice this sequence is, its request's group,
    # and (on choice 0 until its prefill ends) the choices forked from it when it first samples
    index: int = 0
    group: ChoiceGroup[Sequence] | None = None
    pending_forks: list[Sequence] = field(default_factory=list)
    fork_token: int | None = None  # a forked choice's first token, sampled from choice 0's logits
    constraint: ConstraintState | None = None  # its grammar's matcher (structured output)
    # runtime.engine.logprobs: what the runner computed for the rows that asked (attach_logprobs
    # moves it onto the next output); the prompt's list has None for position 0
    step_logprob: TokenLogprob | None = None
    # of the sampled tokens, summed only when asked (logprobs, or best_of > n ranks by it)
    cumulative_logprob: float = 0.0
    prompt_logprobs: list[TokenLogprob | None] | None = None
    prompt_logprobs_sent: bool = False

    @property
    def needs_prompt_logits(self) -> bool:
        """Prompt logprobs asked and not yet sent: every prompt position must be computed."""
        return self.request.sampling.prompt_logprobs is not None and not self.prompt_logprobs_sent

    @property
    def cache_lookup_ids(self) -> list[int]:
        """What the prefix cache may serve: nothing while the prompt's logits are needed (a
        cached page has K/V but no logits), the whole sequence otherwise."""
        return [] if self.needs_prompt_logits else self.token_ids

    @property
    def request_id(self) -> str:
        """The sequence's id (its KV's, the scheduler's): the request's id, `#index` after it for
        the choices after the first."""
        rid = self.request.request_id
        return rid if self.index == 0 else f"{rid}#{self.index}"

    @property
    def num_seqs(self) -> int:
        """Sequences this one stands for in admission: itself and the choices it will fork."""
        return 1 + len(self.pending_forks)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.request.prompt_token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.request.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_computed_tokens(self) -> int:
        return 0 if self.kv is None else self.kv.num_tokens

    @property
    def num_pending_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def kv_capacity(self) -> int:
        """Tokens of KV this sequence can ever need (pages are taken as it grows; only the
        benchmark's emulation of the old policy reserves this much up front)."""
        return self.num_prompt_tokens + self.request.sampling.max_tokens

    @property
    def token_ids(self) -> list[int]:
        return self.request.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """token_ids[start:end] without building token_ids when the range is in the prompt."""
        prompt = self.request.prompt_token_ids
        if end <= len(prompt):
            return prompt[start:end]
        return (prompt + self.output_token_ids)[start:end]

    def pending_token_ids(self, num_tokens: int) -> list[int]:
        start = self.num_computed_tokens
        if start >= self.num_prompt_tokens:  # decoding: outputs only, no list concatenation
            offset = start - self.num_prompt_tokens
            return self.output_token_ids[offset : offset + num_tokens]
        return self.token_slice(start, start + num_tokens)

    def mark(self, event: RequestEvent, ts: float | None = None) -> float:
        """Record a lifecycle event (wall clock) in the request's stats; returns the timestamp."""
        ts = time.time() if ts is None else ts
        self.stats.events.append((event, ts))
        if event is RequestEvent.SCHEDULED and self.stats.scheduled_ts is None:
            self.stats.scheduled_ts = ts
        elif event is RequestEvent.FIRST_TOKEN:
            self.stats.first_token_ts = ts
        elif event in (RequestEvent.FINISHED, RequestEvent.CANCELLED):
            self.stats.finished_ts = ts
        return ts
