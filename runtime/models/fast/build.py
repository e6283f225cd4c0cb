"""What is built around the model's one forward at load, and the settings that pick it.

    fast = get_fast_path(loaded, FastPathOptions(compile="auto", cuda_graphs="auto", max_batch=64))
    hidden = fast(input_ids, seqs) if fast is not None else loaded.model(input_ids, seqs)

There is one forward (`CausalLM.forward`, each `DecoderLayer` the fused sequence, prefill and
decode alike); this module only decides whether it is compiled and whether its decode call is
captured, and builds that once per loaded model.
`compile` (auto | on | off). auto: torch.compile nowhere (docs/performance.md: on CPU the
compiled step is faster but its first load compiles for a minute or more on a loaded 2-core
machine, and a restart still re-traces; no GPU measurement yet). on, CPU: the whole decode step
compiled by inductor as one graph (`cpu_step.CompiledStep`, every weight format), its caches
under the model's cache directory (`compile_cache`), paid here at load; a failure decodes on the
eager forward instead (`FastPath.num_compile_fallbacks`), never a failed start. on, CUDA: each
decoder layer's two halves around the attention core (`DecoderLayer.attn_in`, `.attn_out_mlp`)
compiled by inductor on a view of the model that shares its parameters (the loaded model itself
stays uncompiled: the reference `fastllm doctor` compares with), then captured. off: nothing
compiled, nothing captured.
`cuda_graphs` (auto | on | off): on CUDA, capture the model's decode call per batch-size bucket
(auto when the device is CUDA and compile is not off; on: a CPU device is a ConfigError).

Built once per (loaded model, compile, cuda_graphs) and kept on the `LoadedModel`, so an engine
made per call (offline `generate`) or per replica never pays it again; the time it took is on
`FastPath.startup_s` for the engine's load log.
"""

from __future__ import annotations

import copy
import functools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from runtime.errors import ConfigError
from runtime.memory.kv_pool import SequenceKV
from runtime.models.base import CausalLM
from runtime.models.batch_plan import SeqSlice
from runtime.models.fast.compile_cache import inductor_cache_dir, model_cache_dir
from runtime.models.fast.cpu_step import CompiledStep
from runtime.models.fast.graphs import GraphDecoder
from runtime.models.layers import DecoderLayer

if TYPE_CHECKING:
    from runtime.models.loader import LoadedModel

log = logging.getLogger(__name__)
MODES = ("auto", "on", "off")
_build_lock = threading.Lock()  # engines sharing one loaded model build its fast path once


@dataclass(frozen=True)
class FastPathOptions:
    compile: str = "auto"  # see the module doc
    cuda_graphs: str = "auto"
    max_batch: int = 64  # largest captured bucket: the engine's batch bound
    cache_dir: Path | None = None  # root of the compiled step's caches (None: compile_cache's)

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
    whole_step: bool = False  # CPU: the whole decode step one inductor graph (cpu_step)

    @property
    def kind(self) -> str:
        parts = (["cuda-graphs"] if self.uses_graphs else []) + (
            ["inductor"] if self.uses_inductor else []
        )
        return "+".join(parts)


def plan_fast_path(options: FastPathOptions, device: torch.device) -> FastPlan | None:
    """None: the model's forward, as it is, for every step (nothing to build)."""
    if options.cuda_graphs == "on" and device.type != "cuda":
        raise ConfigError(f"cuda_graphs=on needs a CUDA device, not {device}", param="cuda_graphs")
    if options.compile == "off":
        return None
    graphs = device.type == "cuda" and options.cuda_graphs != "off"
    inductor = options.compile == "on"
    if not (graphs or inductor):
        return None
    return FastPlan(uses_inductor=inductor, uses_graphs=graphs, whole_step=device.type == "cpu")


@dataclass
class FastPath:
    # the (compiled) model itself, its captured decode call, or its compiled CPU step
    step: CausalLM | GraphDecoder | CompiledStep
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

    @property
    def runs_prefill(self) -> bool:
        """The compiled CPU step's graphs are dynamic in the token count and attend through the
        step's plan, so a prefill or mixed step is the same graph; captured CUDA buckets hold
        one token per sequence, so only decode steps replay them."""
        return isinstance(self.step, CompiledStep)

    @property
    def num_compile_fallbacks(self) -> int:
        """1 once a compiled CPU step fell back to the eager forward (at load or later)."""
        return self.step.num_fallbacks if isinstance(self.step, CompiledStep) else 0

    @property
    def fallback_reason(self) -> str | None:
        return self.step.fallback_reason if isinstance(self.step, CompiledStep) else None

    def __call__(self, input_ids: Tensor, seqs: Sequence[SeqSlice]) -> Tensor:
        return self.step(input_ids, seqs)


def get_fast_path(loaded: LoadedModel, options: FastPathOptions) -> FastPath | None:
    """The loaded model's fast path for these options: built on first use, then reused (a
    captured one is rebuilt only when a larger batch bound asks for more buckets)."""
    plan = plan_fast_path(options, loaded.device)
    if plan is None or not isinstance(loaded.model, CausalLM):
        return None
    if loaded.quantization is not None and not plan.whole_step:
        # torch's weight-only kernels under CUDA graph capture are not tested here: a quantized
        # model on CUDA runs the one forward as it is (on CPU: tests/runtime/models/test_cpu_step)
        return None

    key = (options.compile, options.cuda_graphs)
    with _build_lock:
        cached: FastPath | None = loaded.fast_paths.get(key)
        if cached is not None and (not cached.buckets or cached.buckets[-1] >= options.max_batch):
            return cached
        if plan.whole_step:
            built = build_cpu_step(loaded, plan, options)
        else:
            built = build_fast_path(loaded.model, plan, options)
        loaded.fast_paths[key] = built
        return built


def build_cpu_step(loaded: LoadedModel, plan: FastPlan, options: FastPathOptions) -> FastPath:
    """The compiled CPU step, its graphs compiled now (under the model's cache directory)."""
    started = time.perf_counter()
    model = cast(CausalLM, loaded.model)
    quant = loaded.quantization
    fmt = "float" if quant is None else f"{quant.method}/g{quant.group_size}"
    if quant is not None and quant.head is not None:
        fmt += "+int8-head"
    cache = model_cache_dir(options.cache_dir, loaded.path, loaded.dtype, fmt)
    log.info(
        "compiling the decode step with inductor (%s %s); caches in %s", loaded.dtype, fmt, cache
    )
    step = CompiledStep(model)
    try:
        with inductor_cache_dir(cache):
            step.warm_up(directory=cache)
    except OSError as exc:  # an unwritable cache directory: eager, not a failed start
        step.fall_back(exc)
    return FastPath(step, plan, options, time.perf_counter() - started)


def build_fast_path(model: CausalLM, plan: FastPlan, options: FastPathOptions) -> FastPath:
    started = time.perf_counter()
    if plan.uses_inductor:
        model = compiled_view(model)
        if not plan.uses_graphs:
            warm_up(model)  # compile now, not on a request
    step: CausalLM | GraphDecoder = model
    if plan.uses_graphs:
        graphs = GraphDecoder(model, options.max_batch)
        graphs.capture()
        step = graphs
    return FastPath(step, plan, options, time.perf_counter() - started)


def compiled_view(model: CausalLM) -> CausalLM:
    """The same model (its parameters and submodules shared, nothing copied but the layer
    objects) whose layers run their two halves compiled by inductor. One compiled function per
    half serves every layer (the layer is its argument, its weights graph inputs); dynamic: one
    graph for every T > 1 (T = 1 is specialised by dynamo: warm_up runs both)."""
    attn_in = torch.compile(DecoderLayer.attn_in, dynamic=True)
    attn_out_mlp = torch.compile(DecoderLayer.attn_out_mlp, dynamic=True)
    view = copy.copy(model)
    view._modules = dict(model._modules)  # so that setting `layers` leaves the model's alone
    layers = []
    for layer in model.layers:
        twin = copy.copy(cast(DecoderLayer, layer))  # shares its norms, attn, mlp
        # instance attributes shadow the methods: DecoderLayer.forward calls through self
        setattr(twin, "attn_in", functools.partial(attn_in, twin))  # noqa: B010
        setattr(twin, "attn_out_mlp", functools.partial(attn_out_mlp, twin))  # noqa: B010
        layers.append(twin)
    view.layers = nn.ModuleList(layers)
    return view


def warm_up(model: CausalLM, sizes: Sequence[int] = (1, 2)) -> None:
    """One step per size on a scratch page pool (nothing of a request is touched)."""
    a, weight = model.args, model.embed_tokens.weight
    for n in sizes:
        pool = SequenceKV.empty(
            a.num_layers, a.num_kv_heads, a.head_dim, n, weight.dtype, weight.device, page_size=1
        )
        kvs = [SequenceKV(pool.data) for _ in range(n)]
        for i, kv in enumerate(kvs):
            kv.page_ids = [pool.page_ids[i]]  # one one-token page each, in one pool
        ids = torch.zeros(n, dtype=torch.long, device=weight.device)
        model(ids, [SeqSlice(i, i + 1, kv) for i, kv in enumerate(kvs)])
