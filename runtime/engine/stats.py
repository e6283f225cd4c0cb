"""Numbers the engine emits. Sinks (Prometheus, OpenTelemetry, SQL) consume them; the core never
imports a sink library. Each dataclass is computed once, outside the model's hot loop, and the same
values feed histograms, span attributes and `inference_log` rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from runtime.memory.stats import AllocatorStats as AllocatorStats  # re-exported for the sinks
from runtime.memory.stats import KVCacheStats as KVCacheStats
from runtime.memory.stats import TierStats as TierStats


# Why a request ended: the finish reasons of a completed request and the failure reasons of one
# that did not complete. Both are str-valued, so JSON bodies, metric labels, span attributes and
# `inference_log.status` read exactly as the plain strings did (`FinishReason.STOP == "stop"`).
class _StrEnum(str, Enum):
    """A str whose str() and format() are its value on every Python this project supports."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class FinishReason(_StrEnum):
    STOP = "stop"  # eos, a stop token id or a stop string
    LENGTH = "length"  # max_tokens reached
    CANCELLED = "cancelled"  # the client went away or cancelled


class FailureReason(_StrEnum):
    VALIDATION = "validation"  # the request was refused as invalid (4xx)
    OVERLOADED = "overloaded"  # admission refused (429)
    INTERNAL = "internal"  # a model step or a replica failed (5xx)
    TIMEOUT = "timeout"  # the request ran past its deadline
    UNAUTHORIZED = "unauthorized"  # refused before authentication (counted, no inference_log row)


class RequestEvent(str, Enum):
    QUEUED = "QUEUED"
    SCHEDULED = "SCHEDULED"
    FIRST_TOKEN = "FIRST_TOKEN"
    FINISHED = "FINISHED"
    CANCELLED = "CANCELLED"


@dataclass(frozen=True)
class StepStats:
    """One engine step (schedule → execute → update)."""

    ts: float  # wall clock (time.time()) at step end
    step_id: int
    num_seqs: int  # sequences in the batch this step (the batch size)
    num_prefill_tokens: int
    num_decode_tokens: int
    busy_seconds: float  # time spent in execute() (model forward + sampling)
    num_running: int  # after the step
    num_waiting: int  # after the step
    batch_size_limit: int  # the adaptive policy's current cap
    request_ids: tuple[str, ...] = ()  # requests served by this step (span links)
    started_ts: float = 0.0  # wall clock at step start
    allocator: AllocatorStats | None = None
    model: str = ""
    version: str = ""
    num_sampled: int = 0  # sequences that sampled a token (logits computed for these rows only)
    # query-key pairs the step's attention scored: a chunk of m new tokens after p cached ones
    # adds m * p + m * (m + 1) / 2 (a decode at context L adds L): the step-time model's context
    num_attention_pairs: int = 0
    # at schedule time requests were left waiting with the batch at the limit: a larger limit would
    # have batched more (the batch controller holds while the limit does not bind)
    limit_binds: bool = False
    # with the limit binding: how long the head of the queue, never admitted yet, had waited for
    # a place (seconds; 0 for a preempted sequence back at the head: it waits for pages);
    # past the policy's max_queue_wait_s the controller grows the limit whatever its band says
    queue_wait_s: float = 0.0
    kv: KVCacheStats | None = None  # the page pool after the step (and cumulative prefix counts)
    # 1 once the model's compiled decode step fell back to the eager forward (runtime.models.fast:
    # a compile or kernel failure), for good; 0 while it runs compiled or nothing was compiled
    compile_fallbacks: int = 0
    # speculative decoding (runtime.engine.spec): tokens drafted and verified this step, how many
    # the target accepted, and the tokens the drafting rows emitted (accepted + one each);
    # spec_method: the engine's method ("" or "off": not configured)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0
    spec_method: str = ""


@dataclass
class RequestStats:
    """One request's life. Timestamps are wall clock seconds (time.time()); None if not reached."""

    request_id: str
    model: str
    version: str = "stable"
    queued_ts: float = 0.0
    scheduled_ts: float | None = None
    first_token_ts: float | None = None
    finished_ts: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (first schedule)
    max_tokens: int = 0
    n: int = 1  # choices asked for (each choice is a sequence of its own)
    # n / best_of > 1: the longest sequence's tokens (completion_tokens sums every sequence's,
    # generated side by side): what the time per output token divides by; 0 = one sequence
    longest_choice_tokens: int = 0
    logprobs: bool = False  # sampled or prompt log-probabilities were asked
    constraint: str = "none"  # structured output: none | json | regex | choice | grammar | tools
    grammar_cache_hit: bool | None = None  # constrained: its compiled grammar came from the cache
    grammar_compile_seconds: float | None = None  # constrained, cache miss: the compile it waited
    grammar_incomplete: bool = False  # constrained, ended (stop/length) before the grammar did
    grammar_cache_evictions: int = 0  # cache entries evicted to make room for its grammar
    grammar_compile_timeout: bool = False  # its compile ran past its budget (worker killed)
    # "stop" | "length" | "cancelled" when it ended normally; None when it failed
    finished_reason: FinishReason | None = None
    # "validation" | "overloaded" | "internal" | "timeout" when it failed; None otherwise
    failure_reason: FailureReason | None = None
    batch_size: int = 0  # largest batch this request was part of
    operation: str = "text_completion"  # gen_ai.operation.name: text_completion | chat | embeddings
    # W3C trace context of the incoming request (a `traceparent` header value), if any
    traceparent: str | None = None
    priority: int = 0  # the request's scheduling priority (runtime.engine.priority)
    events: list[tuple[RequestEvent, float]] = field(default_factory=list)
    # speculative decoding: tokens drafted for this request (every choice) and accepted by the
    # target; acceptance = accepted / drafted (None when nothing was drafted)
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0

    @property
    def spec_acceptance_ratio(self) -> float | None:
        if not self.spec_draft_tokens:
            return None
        return self.spec_accepted_tokens / self.spec_draft_tokens

    adapter: str | None = None  # the LoRA adapter the request was served with (None: the base)

    @property
    def status(self) -> str:
        if self.failure_reason is not None:
            return self.failure_reason
        return self.finished_reason or "unknown"

    @property
    def ttft_seconds(self) -> float | None:
        if self.first_token_ts is None:
            return None
        return self.first_token_ts - self.queued_ts

    @property
    def e2e_seconds(self) -> float | None:
        if self.finished_ts is None:
            return None
        return self.finished_ts - self.queued_ts

    @property
    def queue_seconds(self) -> float | None:
        if self.scheduled_ts is None:
            return None
        return self.scheduled_ts - self.queued_ts

    @property
    def tpot_seconds(self) -> float | None:
        """Mean time per output token after the first one."""
        steps = self.longest_choice_tokens or self.completion_tokens
        if self.first_token_ts is None or self.finished_ts is None or steps < 2:
            return None
        return (self.finished_ts - self.first_token_ts) / (steps - 1)


@dataclass(frozen=True)
class VerificationResult:
    """One verification probe: the production value next to the reference-path value."""

    request_id: str
    model: str
    version: str
    op: str  # "logit", "geglu", "swiglu", "rms_norm", "rotary", "attention"
    output: float
    expected: float
    ts: float
    # the bound it was checked against (runtime.verify.tolerance); None: the sink's own threshold
    tolerance: float | None = None

    @property
    def abs_error(self) -> float:
        return abs(self.output - self.expected)

    def is_anomaly(self, threshold: float) -> bool:
        """Beyond its own tolerance, else beyond `threshold`; NaN counts (`not <=`)."""
        bound = threshold if self.tolerance is None else self.tolerance
        return not self.abs_error <= bound


class StatsSink(Protocol):
    """Anything that consumes engine numbers. Must be cheap and must never raise into the engine."""

    def record(
        self,
        step: StepStats | None = None,
        finished: Sequence[RequestStats] = (),
        verified: Sequence[VerificationResult] = (),
    ) -> None: ...


class FanOut:
    """The one `record(...)` the engine calls; forwards to every registered sink.

    A sink that raises is isolated (counted, not propagated): telemetry must never fail a request.
    """

    def __init__(self, sinks: Sequence[StatsSink] = ()) -> None:
        self.sinks: list[StatsSink] = list(sinks)
        self.num_sink_errors = 0

    def add(self, sink: StatsSink) -> None:
        self.sinks.append(sink)

    def record(
        self,
        step: StepStats | None = None,
        finished: Sequence[RequestStats] = (),
        verified: Sequence[VerificationResult] = (),
    ) -> None:
        for sink in self.sinks:
            try:
                sink.record(step=step, finished=finished, verified=verified)
            except Exception:  # isolation is the point: telemetry never fails a request
                self.num_sink_errors += 1
