"""The batching dashboard's speculative-decoding row: acceptance by method, requests that
drafted, drafted / accepted / emitted tokens per second. Each reads 0, not "No data" or NaN,
while nothing drafts (speculation is off by default): the acceptance divides by at least one
drafted token."""

from grafanalib.core import TimeSeries

from dashboards.common import MODEL_SEL, PROMETHEUS, RATE, prom

_DRAFT = f"rate(fastllm_spec_decode_num_draft_tokens_total{{{MODEL_SEL}}}[{RATE}])"
_ACCEPTED = f"rate(fastllm_spec_decode_num_accepted_tokens_total{{{MODEL_SEL}}}[{RATE}])"
_DRAFT_N = f"increase(fastllm_spec_decode_num_draft_tokens_total{{{MODEL_SEL}}}[{RATE}])"
_ACCEPTED_N = f"increase(fastllm_spec_decode_num_accepted_tokens_total{{{MODEL_SEL}}}[{RATE}])"
_EMITTED = f"rate(fastllm_spec_decode_num_emitted_tokens_total{{{MODEL_SEL}}}[{RATE}])"

SPEC_ROW = (
    8,
    [
        (
            8,
            TimeSeries(
                title="Speculative decoding: acceptance by method",
                description="Drafted tokens the model accepted / drafted (speculative_method). "
                "Low acceptance costs compute: requests under 20% stop drafting on their own.",
                dataSource=PROMETHEUS,
                targets=[
                    prom(
                        f"sum by (method) ({_ACCEPTED_N}) / clamp_min(sum by (method) "
                        f"({_DRAFT_N}), 1)",
                        "{{method}}",
                    )
                ],
                unit="percentunit",
            ),
        ),
        (
            8,
            TimeSeries(
                title="Requests that drafted/s",
                description="Finished requests that drafted tokens (their acceptance is the "
                "fastllm_spec_decode_acceptance_ratio histogram; inference_log has each one's).",
                dataSource=PROMETHEUS,
                targets=[
                    prom(
                        "sum(rate(fastllm_spec_decode_acceptance_ratio_count"
                        f"{{{MODEL_SEL}}}[{RATE}]))",
                        "requests",
                    )
                ],
                unit="reqps",
            ),
        ),
        (
            8,
            TimeSeries(
                title="Drafted, accepted and emitted tokens/s",
                description="Emitted: tokens the verification steps produced (accepted drafts "
                "plus the model's own next token).",
                dataSource=PROMETHEUS,
                targets=[
                    prom(f"sum({_DRAFT})", "drafted", "A"),
                    prom(f"sum({_ACCEPTED})", "accepted", "B"),
                    prom(f"sum({_EMITTED})", "emitted", "C"),
                ],
                unit="short",
            ),
        ),
    ],
)
