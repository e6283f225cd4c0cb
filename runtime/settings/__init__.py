"""The settings' fields by area, each group a model `runtime.config.Settings` inherits.

model.py      what is served and how: checkpoint, device, quantization, LoRA, speculation, TP
engine.py     the engine: batch bounds, KV pool, allocator, batch policy, grammars, priority, shares
server.py     the HTTP server: keys, limits, drain, connections, queries, rollout peers, offload
telemetry.py  metrics, tracing, the inference log, verification and alerts

The checks across groups, the sources (flags, FASTLLM_* environment, YAML) and the loading with
its one-line errors stay in runtime.config.
"""
