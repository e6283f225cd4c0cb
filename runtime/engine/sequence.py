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

from runtime.engine.features import SeqFeatures
from runtime.engine.request import GenerationRequest, RequestHandle
from runtime.engine.stats import RequestEvent, RequestStats

if TYPE_CHECKING:
    import torch

    from runtime.engine.choice_group import ChoiceGroup
    from runtime.engine.constraints.state import ConstraintState
    from runtime.engine.spec.state import SpecState
    from runtime.engine.stopping import StopChecker
    from runtime.memory.kv_pool import SequenceKV


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """What every sequence needs, and one optional slot for the state of the features it uses
    (runtime.engine.features: seed, choices, constraint, logprobs, verification)."""

    request: GenerationRequest
    handle: RequestHandle
    stats: RequestStats
    deadline: float  # time.monotonic() after which the request fails with RequestTimeout
    stop_checker: StopChecker
    output_token_ids: list[int] = field(default_factory=list)
    kv: SequenceKV | None = None
    status: SequenceStatus = SequenceStatus.WAITING
    num_preemptions: int = 0
    arrival_index: int = -1  # admission order (the scheduler's); kept across preemptions
    is_closed: bool = False  # the handle got its final output; the engine is done with it
    features: SeqFeatures | None = None  # None: a plain sequence (see features.py)
    # speculative decoding's state (runtime.engine.spec): None until the speculator first sees
    # the sequence decode, never set when speculation is off
    spec: SpecState | None = None

    # --- each feature's slot, read where its feature is handled ---------------------------------
    @property
    def is_plain(self) -> bool:
        """No feature and greedy: nothing to build for it but an argmax."""
        return self.features is None and self.request.sampling.is_greedy

    @property
    def generator(self) -> torch.Generator | None:
        return None if self.features is None else self.features.generator

    @property
    def constraint(self) -> ConstraintState | None:
        return None if self.features is None else self.features.constraint

    @property
    def is_verified(self) -> bool:
        """Sampled for verification at admission (runtime.verify reads it when it closes)."""
        return self.features is not None and self.features.verify is not None

    @property
    def chosen_logit(self) -> float | None:
        """The logit of the last token sampled, before the logits processors (verified only)."""
        f = self.features
        return None if f is None or f.verify is None else f.verify.chosen_logit

    @property
    def index(self) -> int:
        """Which choice of its request this sequence is (0 without n / best_of)."""
        f = self.features
        return 0 if f is None or f.choice is None else f.choice.index

    @property
    def group(self) -> ChoiceGroup[Sequence] | None:
        f = self.features
        return None if f is None or f.choice is None else f.choice.group

    @property
    def pending_forks(self) -> list[Sequence]:
        """On choice 0 until its prefill ends: the choices that fork from it when it samples."""
        f = self.features
        return [] if f is None or f.choice is None else f.choice.pending_forks

    @property
    def needs_prompt_logits(self) -> bool:
        """Prompt logprobs asked and not yet sent: every prompt position must be computed."""
        f = self.features
        return f is not None and f.logprobs is not None and f.logprobs.needs_prompt_logits

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
