"""Speculative-decoding metrics (vLLM's `spec_decode_*` mapped into `fastllm_`): a sink of its
own next to the Prometheus sink, on the same registry. It reads the step's draft counts and each
finished request's acceptance (runtime.engine.spec fills them).

    fastllm_spec_decode_num_draft_tokens_total{method}     tokens drafted and verified
    fastllm_spec_decode_num_accepted_tokens_total{method}  of those, accepted by the model
    fastllm_spec_decode_num_emitted_tokens_total{method}   tokens the drafting rows emitted
                                                           (accepted + the model's own one each)
    fastllm_spec_decode_acceptance_ratio{method}           per request that drafted: accepted /
                                                           drafted
The acceptance rate over time is rate(accepted) / rate(draft); emitted / verification steps is
the mean tokens per step of a drafting row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

from runtime.engine.stats import RequestStats, StepStats, VerificationResult

__all__ = ["SPEC_METRIC_NAMES", "SpecDecodeMetrics", "SpecDecodeSink"]

SPEC_METRIC_NAMES: tuple[str, ...] = (
    "fastllm_spec_decode_num_draft_tokens_total",
    "fastllm_spec_decode_num_accepted_tokens_total",
    "fastllm_spec_decode_num_emitted_tokens_total",
    "fastllm_spec_decode_acceptance_ratio",
)
ACCEPTANCE_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
_LABELS = ("model", "version", "method")


@dataclass
class SpecDecodeMetrics:
    draft_tokens: Counter
    accepted_tokens: Counter
    emitted_tokens: Counter
    acceptance: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry) -> SpecDecodeMetrics:
        r = registry
        return cls(
            draft_tokens=Counter(
                "fastllm_spec_decode_num_draft_tokens_total",
                "Speculative decoding: tokens drafted and verified by the model.",
                _LABELS,
                registry=r,
            ),
            accepted_tokens=Counter(
                "fastllm_spec_decode_num_accepted_tokens_total",
                "Speculative decoding: drafted tokens the model accepted.",
                _LABELS,
                registry=r,
            ),
            emitted_tokens=Counter(
                "fastllm_spec_decode_num_emitted_tokens_total",
                "Speculative decoding: tokens emitted by verification steps (accepted drafts "
                "plus the model's own next token).",
                _LABELS,
                registry=r,
            ),
            acceptance=Histogram(
                "fastllm_spec_decode_acceptance_ratio",
                "Speculative decoding: accepted / drafted tokens per request that drafted.",
                _LABELS,
                buckets=ACCEPTANCE_BUCKETS,
                registry=r,
            ),
        )

    def init_labels(self, model: str, version: str, method: str) -> None:
        for metric in (self.draft_tokens, self.accepted_tokens, self.emitted_tokens):
            metric.labels(model, version, method)
        self.acceptance.labels(model, version, method)


class SpecDecodeSink:
    """A StatsSink: maps the draft counts of steps and requests to the metrics above."""

    def __init__(
        self, metrics: SpecDecodeMetrics, models: Sequence[tuple[str, str]] = (), method: str = ""
    ) -> None:
        self.metrics = metrics
        self.method = method  # the served method: the requests' label (steps carry their own)
        for model, version in models:
            metrics.init_labels(model, version, method)

    def record(
        self,
        step: StepStats | None = None,
        finished: Sequence[RequestStats] = (),
        verified: Sequence[VerificationResult] = (),
    ) -> None:
        m = self.metrics
        if step is not None and step.num_draft_tokens:
            labels = (step.model, step.version, step.spec_method or self.method)
            m.draft_tokens.labels(*labels).inc(step.num_draft_tokens)
            m.accepted_tokens.labels(*labels).inc(step.num_accepted_tokens)
            m.emitted_tokens.labels(*labels).inc(step.num_emitted_tokens)
        for r in finished:
            ratio = r.spec_acceptance_ratio
            if ratio is not None:
                m.acceptance.labels(r.model, r.version, self.method).observe(ratio)
