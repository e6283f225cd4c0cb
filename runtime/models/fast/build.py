"""Building the fast decode step once per loaded model, and the settings that pick it.

    fast = get_fast_path(loaded, FastPathOptions(compile="auto", cuda_graphs="auto", max_batch=64))
    hidden = fast(input_ids, seqs) if fast is not None else loaded.model(input_ids, seqs)

`compile` (auto | on | off): the decode step built at load from fused pieces
(`runtime.models.fast.pieces`). off: every step on the eager module forward (the reference).
auto: the fused step, with torch.compile nowhere (measured on CPU, batch-1 `small` llama:
inductor's per-call overhead outweighs its fusion and each piece takes ~25-100 s to compile on
a loaded 2-core machine; no GPU measurement yet). on: the fused step with its two pieces
compiled by inductor, paid here, at load.
`cuda_graphs` (auto | on | off): on CUDA, capture the fused step per batch-size bucket (auto
when the device is CUDA and compile is not off; on: a CPU device is a ConfigError).

Built once per (loaded model, compile, cuda_graphs) and kept on the `LoadedModel`, so an engine
made per call (offline `generate`) or per replica never pays it again; the time it took is on
`FastPath.startup_s` for the engine's load log.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from runtime.errors import ConfigError
from runtime.memory.kv_cache import SequenceKV
from runtime.models.base import CausalLM
from runtime.models.batch_plan import SeqSlice
from runtime.models.fast.decoder import FusedDecoder
from runtime.models.fast.graphs import GraphDecoder

if TYPE_CHECKING:
    from runtime.models.loader import LoadedModel

MODES = ("auto", "on", "off")
_build_lock = threading.Lock()  # engines sharing one loaded model build its fast path once


@dataclass(frozen=True)
class FastPathOptions:
    compile: str = "auto"  # see the module doc
    cuda_graphs: str = "auto"
    max_batch: int = 64  # largest captured bucket: the engine's batch bound

    def __post_init__(self) -> None:
        for name in ("compile", "cuda_graphs"):
            if getattr(self, name) not in MODES:
                raise ConfigError(f"{name} must be one of auto, on, off", param=name)
        if self.max_batch < 1:
            raise ConfigError("max_batch must be >= 1", param="max_num_seqs")


@dataclass(frozen=True)
class FastPlan:
    """What the options mean on this device."""

    uses_inductor: bool
    uses_graphs: bool

    @property
    def kind(self) -> str:
        base = "cuda-graphs" if self.uses_graphs else "fused"
        return base + ("+inductor" if self.uses_inductor else "")


def plan_fast_path(options: FastPathOptions, device: torch.device) -> FastPlan | None:
    """None: the eager forward for every step."""
    if options.cuda_graphs == "on" and device.type != "cuda":
        raise ConfigError(f"cuda_graphs=on needs a CUDA device, not {device}", param="cuda_graphs")
    if options.compile == "off":
        return None
    graphs = device.type == "cuda" and options.cuda_graphs != "off"
    return FastPlan(uses_inductor=options.compile == "on", uses_graphs=graphs)


@dataclass
class FastPath:
    step: FusedDecoder | GraphDecoder
    plan: FastPlan
    options: FastPathOptions
    startup_s: float  # build (+ compile, capture) time, paid at load

    @property
    def kind(self) -> str:
        return self.plan.kind

    @property
    def buckets(self) -> tuple[int, ...]:
        """Captured batch sizes; () when uncaptured."""
        return self.step.sizes if isinstance(self.step, GraphDecoder) else ()

    def __call__(self, input_ids: Tensor, seqs: Sequence[SeqSlice]) -> Tensor:
        return self.step(input_ids, seqs)


def get_fast_path(loaded: LoadedModel, options: FastPathOptions) -> FastPath | None:
    """The loaded model's fast path for these options: built on first use, then reused (a
    captured one is rebuilt only when a larger batch bound asks for more buckets)."""
    plan = plan_fast_path(options, loaded.device)
    if plan is None or not isinstance(loaded.model, CausalLM):
        return None
    if loaded.quantization is not None:
        return None  # the fused step reads float `weight_t`; quantized linears run eager

    key = (options.compile, options.cuda_graphs)
    with _build_lock:
        cached: FastPath | None = loaded.fast_paths.get(key)
        if cached is not None and (not cached.buckets or cached.buckets[-1] >= options.max_batch):
            return cached
        built = build_fast_path(loaded.model, plan, options)
        loaded.fast_paths[key] = built
        return built


def build_fast_path(model: CausalLM, plan: FastPlan, options: FastPathOptions) -> FastPath:
    started = time.perf_counter()
    fused = FusedDecoder(model)
    if plan.uses_inductor:
        _compile_pieces(fused)
        if not plan.uses_graphs:
            warm_up(fused, model)  # compile now, not on a request
    step: FusedDecoder | GraphDecoder = fused
    if plan.uses_graphs:
        graphs = GraphDecoder(fused, options.max_batch)
        graphs.capture()
        step = graphs
    return FastPath(step, plan, options, time.perf_counter() - started)


def _compile_pieces(fused: FusedDecoder) -> None:
    # dynamic: one graph for every T > 1 (T = 1 is specialised by dynamo: warm_up runs both)
    compiled: Any = torch.compile(fused.attn_in, dynamic=True)
    fused.attn_in = compiled
    compiled = torch.compile(fused.attn_out_mlp, dynamic=True)
    fused.attn_out_mlp = compiled


def warm_up(fused: FusedDecoder, model: CausalLM, sizes: Sequence[int] = (1, 2)) -> None:
    """One step per size on a scratch page pool (nothing of a request is touched)."""
    a, weight = model.args, model.embed_tokens.weight
    for n in sizes:
        pool = SequenceKV.empty(
            a.num_layers, a.num_kv_heads, a.head_dim, n, weight.dtype, weight.device, block_size=1
        )
        kvs = [SequenceKV(pool.data) for _ in range(n)]
        for i, kv in enumerate(kvs):
            kv.page_ids = [pool.page_ids[i]]  # one one-token page each, in one pool
        ids = torch.zeros(n, dtype=torch.long, device=weight.device)
        fused(ids, [SeqSlice(i, i + 1, kv) for i, kv in enumerate(kvs)])
