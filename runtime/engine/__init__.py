"""The engine: load once, admit, continuous batching, emit stats. Imports nothing of the sinks.

engine.py        Engine: the EngineClient a server holds for one model version
introspection.py Engine's control and figures (batch policy, stats, LoRA, TP), off the path
client.py        EngineClient: the protocol Engine and serving.ReplicaSet implement
config.py        EngineConfig, derived from runtime.config.Settings
build.py         what the engine builds once the model is loaded (allocator, KV, scheduler, ...)
admission.py     a request's checks (once), the sequence it becomes, its features closed
core.py          the step loop thread: schedule() -> execute() -> update_from_output()
closing.py       how a sequence ends: close (final output, stats, KV freed), expire
postprocess.py   update_from_output: each sampled token (and logprob) to its sequence
failures.py      a failed step or schedule fails its requests, not the engine
scheduler.py     continuous batching: which sequences run this step, how many tokens each
preemption.py    the scheduler's preemption and forks (a sequence back in the queue)
fair_share.py    the waiting queue least-served first; each request's / tenant's batch share
sequence.py      per-request state inside the engine: what every sequence needs + `features`
features.py      the optional feature slots (seed, choices, constraint, logprobs, verification)
model_runner.py  one scheduled step on the model: pack, forward, logits, sample
request.py       what crosses the boundary: GenerationRequest in, TokenOutput stream back
reasons.py       FinishReason / FailureReason (str enums: JSON bodies and labels unchanged)
stats.py         the dataclasses sinks consume (StatsSink, FanOut, NullSink)
sampling/        SamplingParams (flags decided once), the step's SamplingBatch, the Sampler
logprobs.py      logprobs of sampled and prompt tokens; a sequence's LogprobState
choices.py       n / best_of: one prefill, forked page tables (choice_group.py: the group)
grammar_wait.py  a constrained request waits for its grammar outside the scheduler
warmup.py        runs the load-time warm-up sweep on the core
stopping.py      stop conditions and the text a sequence may emit so far
load_once.py     the call-once contract for model loading
embed.py         embeddings for encoder models
batching/        the adaptive batch policy: controller, step-time model, throughput signal, warm-up
constraints/     structured output: specs, the grammar cache, matchers, the grammar mask
logits/          the logits controls as one call over any rows (process_logits)

This package stays light on import (no torch here) so sinks can import `runtime.engine.stats`.
"""
