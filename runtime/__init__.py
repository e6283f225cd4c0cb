"""fastllm runtime: models, allocator, KV cache, scheduler, batcher, engine, server, CLI.

`runtime` core modules (models, allocator, kv_cache, scheduler, batcher, engine) import nothing
of `monitoring`, `storage` or `alerts`: they emit the plain dataclasses of `runtime.engine.stats`.
"""

__version__ = "0.1.0"
