"""The engine boundary as protocols.

`EngineClient` is what the serving layer and the server hold for one model version: `Engine`
(one engine) and `serving.ReplicaSet` (several behind a work-stealing policy) implement it, and
`Router` and `ServerState` are typed with it, so nothing above the engine reaches into either.

`SequenceVerifier` is the hook the engine calls for sampled verification; `runtime.verify`
implements it. A protocol here keeps the engine below `runtime.verify` (the layers contract).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

    from runtime.engine.batching.controller import BatchPolicyConfig
    from runtime.engine.embed import EmbeddingResult
    from runtime.engine.request import GenerationRequest, RequestHandle
    from runtime.engine.sequence import Sequence
    from runtime.memory import LiveBlock
    from runtime.memory.stats import AllocatorStats, KVCacheStats
    from runtime.models.loader import LoadedModel
    from runtime.models.tokenizer import Tokenizer

__all__ = ["EngineClient", "SequenceVerifier"]


class SequenceVerifier(Protocol):
    def should_verify(self, request_id: str) -> bool:
        """Whether this request is sampled for verification (decided at admission)."""
        ...

    def submit_sequence(self, seq: Sequence, model: nn.Module, dtype: torch.dtype) -> bool:
        """Called when a sampled request closes (under the engine lock): queue it, never raise."""
        ...


class EngineClient(Protocol):
    """One model version's engine(s). Every method may be called from any thread."""

    verifier: SequenceVerifier | None

    # loading
    def load(self) -> None: ...
    def start(self) -> None: ...
    def warm_grammars(self) -> None: ...  # compile workers now, not at the first constraint
    @property
    def is_loaded(self) -> bool: ...
    @property
    def loaded(self) -> LoadedModel: ...
    @property
    def tokenizer(self) -> Tokenizer: ...

    # requests
    def submit(self, request: GenerationRequest) -> RequestHandle: ...
    async def asubmit(self, request: GenerationRequest) -> RequestHandle: ...
    def cancel(self, request_id: str) -> bool: ...
    def embed(self, texts: list[str], *, request_id: str | None = None) -> EmbeddingResult: ...

    # control and introspection
    def set_batch_policy(self, min_util: float, max_util: float, step_size: float) -> None: ...
    @property
    def batch_size_limit(self) -> int: ...
    @property
    def batch_policy(self) -> BatchPolicyConfig: ...
    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    def busy_fraction(self) -> float | None: ...
    def utilization(self) -> float | None: ...
    def allocator_stats(self) -> AllocatorStats: ...
    def leak_report(self) -> list[LiveBlock]: ...
    def kv_cache_stats(self) -> KVCacheStats: ...
    def weight_bytes(self) -> dict[str, int]: ...

    # shutdown
    @property
    def is_draining(self) -> bool: ...
    def shutdown(self, drain_timeout_s: float = 0.0) -> None: ...
