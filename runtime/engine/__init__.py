"""The engine: load once, admit, continuous batching, emit stats. Imports nothing of the sinks.

engine.py        Engine: the EngineClient a server holds for one model version
client.py        EngineClient: the protocol Engine and serving.ReplicaSet implement
config.py        EngineConfig, derived from runtime.config.Settings
build.py         what the engine builds once the model is loaded (allocator, KV, scheduler, ...)
core.py          the step loop thread: schedule() -> execute() -> update_from_output()
scheduler.py     continuous batching: which sequences run this step, how many tokens each
sequence.py      per-request state inside the engine
model_runner.py  one scheduled step on the model: pack, forward, sample
request.py       what crosses the boundary: GenerationRequest in, TokenOutput stream back
reasons.py       FinishReason / FailureReason (str enums: JSON bodies and labels unchanged)
stats.py         the dataclasses sinks consume (StatsSink, FanOut, NullSink)
sampling.py      SamplingParams (validated on construction) and the sampler
stopping.py      stop conditions and the text a sequence may emit so far
load_once.py     the call-once contract for model loading
embed.py         embeddings for encoder models
batching/        the adaptive batch policy: controller, step-time model, throughput signal, warm-up

This package stays light on import (no torch here) so sinks can import `runtime.engine.stats`.
"""
