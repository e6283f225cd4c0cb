"""`CompiledStep`: the model's whole decode step compiled by inductor on CPU, as one graph.

On CPU a decode step of a small model is bound by the ~20 small ops a layer runs between its
GEMMs (norms, rotary, SiLU·mul, residual adds, the bf16 casts around quantized kernels) and the
Python between them, each op an OpenMP fork and join. Inductor fuses those chains into a few C++
loops and calls the GEMMs (MKL, torch's int8/int4 weight-only kernels) directly; the casts are
folded into the loops that produce and consume them. Compiling each layer's two halves apart
(what CUDA capture uses) kept the Python and dynamo's guards per half and measured slower than
eager on this CPU; here the step is one graph with one guard check:

    x = embed(ids)
    for each layer:  q, k, v = attn_in(x, cos, sin)                  # compiled
                     attn    = fastllm::paged_attend(q, k, v, layer) # opaque: runs eagerly
                     x       = attn_out_mlp(x, attn)                  # compiled
    hidden = norm(x)

The attention core stays eager behind a custom op (vLLM's "piecewise" cut, in one graph): its
shapes and its paths (a lone run, a gather) change every step, and its inputs beyond q/k/v (the
step's `BatchPlan`) are not tensors; the op reads the plan of the step in flight from a
thread-local set around the call. The graph is the model's own forward pieces, called on the
loaded model itself (its parameters are the graph's inputs: nothing copied).

Shapes: dynamic in the token count (one graph for 1 token, dynamo's 0/1 specialisation, one for
every T >= 2; the step picks by T, so no guard decides and nothing recompiles), built at load by
`warm_up`, never on a request: loaded from the model's cache directory when an earlier start
saved them there (`precompiled`: no tracing, no compiling), else compiled and saved. Kernels read
the thread count at run time (`cpp.dynamic_threads`), so the per-step choice of threads
(runtime.engine.threads) holds for compiled steps too.

A step that raises (a compile error at load, a kernel or a graph's guards failing later) falls
back to the eager forward for good: one log line, `fallback_reason` set, `num_fallbacks` counted.
The step is re-run eagerly; it rewrites the same K/V slots, so a half-run compiled step leaves no
trace.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from runtime.memory.kv_pool import SequenceKV
from runtime.models import batch_plan
from runtime.models.base import CausalLM
from runtime.models.batch_plan import BatchPlan, SeqSlice
from runtime.models.fast import precompiled
from runtime.models.layers import DecoderLayer

log = logging.getLogger(__name__)

# inductor settings of the compiled step (per compile, not global)
INDUCTOR_OPTIONS: dict[str, str | int | bool | Callable[..., Any]] = {"cpp.dynamic_threads": True}
WARM_UP_SIZES = (1, 2)  # T = 1 and the dynamic graph for every T >= 2

_in_flight = threading.local()  # .plan: the BatchPlan of the step this thread is running


@torch.library.custom_op("fastllm::paged_attend", mutates_args=())
def paged_attend(q: Tensor, k: Tensor, v: Tensor, layer_idx: int) -> Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq * D]; writes k/v into the pages of the step in
    flight (declared pure: the pages are not graph values, and nothing in the graph reads them)."""
    plan: BatchPlan = _in_flight.plan
    out = batch_plan.attend(plan, layer_idx, q, k, v)
    return out.reshape(q.shape[0], q.shape[1] * q.shape[2])


@paged_attend.register_fake
def _paged_attend_shape(q: Tensor, k: Tensor, v: Tensor, layer_idx: int) -> Tensor:
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])


def decode_step(model: CausalLM, input_ids: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """`CausalLM.forward` with the plan and rotary rows made outside: input_ids [T] -> [T, H]."""
    x = model.embed(input_ids)
    for layer in model.layers:
        assert isinstance(layer, DecoderLayer)  # dynamo folds it: a guard on the layer's type
        q, k, v = layer.attn_in(x, cos, sin)
        x = layer.attn_out_mlp(x, paged_attend(q, k, v, layer.attn.layer_idx))
    return model.norm(x)


class CompiledStep:
    def __init__(self, model: CausalLM) -> None:
        self.model = model
        self.group = model.args.num_heads // model.args.num_kv_heads
        self.graphs: dict[str, precompiled.Graph] = {}  # by graph_name: built by warm_up
        self.directory: Path | None = None  # where graphs are saved and loaded (warm_up's)
        self.fallback_reason: str | None = None  # set once the step has fallen back to eager
        self.num_fallbacks = 0  # 0 or 1: a fallback is for good
        self.num_compiled_steps = 0
        self.num_loaded_graphs = 0  # graphs read back from `directory` instead of compiled

    @property
    def is_compiled(self) -> bool:
        return self.fallback_reason is None

    def __call__(self, input_ids: Tensor, seqs: Sequence[SeqSlice]) -> Tensor:
        """Like `CausalLM.forward`: hidden [T, H]."""
        if self.fallback_reason is not None:
            return self.model(input_ids, seqs)
        # the graphs guard on the grad mode and on whether their inputs are inference tensors:
        # the same at every call, whatever the caller's mode
        with torch.inference_mode():
            if not input_ids.is_inference():
                input_ids = input_ids.clone()
            fused = self.model.fused_decode
            # bad input raises here, as eager
            plan = BatchPlan.build(seqs, input_ids, self.group, fused_decode=fused)
            cos, sin = self.model.rope_table().lookup(plan.positions)
            if plan.fused_decode and self.model.fused_stack is not None:
                # one call of our own for the whole stack beats the graph (cpu_kernels.stack)
                return self.model.fused_step(input_ids, plan, cos, sin)
        args = (self.model, input_ids, cos, sin)
        _in_flight.plan = plan
        try:
            with torch.inference_mode():
                hidden = self._graph(graph_name(len(input_ids)), args)(*args)
        except torch.OutOfMemoryError:
            raise  # the engine's own recovery (preemption), not the compiler's fault
        except Exception as exc:
            self.fall_back(exc)
            return self.model(input_ids, seqs)
        finally:
            _in_flight.plan = None
        self.num_compiled_steps += 1
        return hidden

    def _graph(self, name: str, example: tuple[Any, ...]) -> precompiled.Graph:
        """The graph `name`: built already, loaded from `directory`, or compiled now (and
        saved there). Normally all built at load by `warm_up`, never on a request."""
        graph = self.graphs.get(name)
        if graph is not None:
            return graph
        path = None
        if self.directory is not None:
            layout = precompiled.layout_key(self.model)
            path = precompiled.graph_path(self.directory, f"{name}-{layout}")
        if path is not None:
            try:
                graph = precompiled.load(path, example)
                self.num_loaded_graphs += 1
            except precompiled.StaleGraph as why:
                log.info("compiling the decode step's graph %s: the saved one is %s", name, why)
        if graph is None:
            graph = precompiled.precompile(decode_step, example, INDUCTOR_OPTIONS)
            if path is not None:
                try:
                    precompiled.save(graph, path)
                except OSError as exc:  # read-only cache: compiled again at the next start
                    log.warning("could not save the compiled decode step to %s: %s", path, exc)
        self.graphs[name] = graph
        return graph

    def fall_back(self, exc: BaseException) -> None:
        if self.fallback_reason is None:
            self.fallback_reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            self.num_fallbacks += 1
            log.warning(
                "compiled decode step failed; decoding on the eager forward from now on (%s)",
                self.fallback_reason,
            )

    def warm_up(self, sizes: Sequence[int] = WARM_UP_SIZES, directory: Path | None = None) -> None:
        """Build every graph a decode step can need (at load), loading those saved under
        `directory` by an earlier start and saving those compiled: one step per size on a
        scratch page pool; a progress line per graph."""
        self.directory = directory
        for n in sizes:
            if self.fallback_reason is not None:
                return
            started, loaded = time.perf_counter(), self.num_loaded_graphs
            self(*scratch_step(self.model, n))
            if self.fallback_reason is None:
                log.info(
                    "%s the decode step for %s in %.1f s",
                    "loaded" if self.num_loaded_graphs > loaded else "compiled",
                    "1 token" if n == 1 else "2+ tokens (dynamic)",
                    time.perf_counter() - started,
                )


def graph_name(num_tokens: int) -> str:
    """One graph for a lone token (dynamo specialises sizes 0 and 1), one for every T >= 2."""
    return "decode-1" if num_tokens == 1 else "decode-n"


def scratch_step(model: CausalLM, num_seqs: int) -> tuple[Tensor, list[SeqSlice]]:
    """A decode step of `num_seqs` one-token sequences on a page pool of its own (nothing of a
    request is touched)."""
    a, weight = model.args, model.embed_tokens.weight
    pool = SequenceKV.empty(
        a.num_layers, a.num_kv_heads, a.head_dim, num_seqs, weight.dtype, weight.device, page_size=1
    )
    kvs = [SequenceKV(pool.data) for _ in range(num_seqs)]
    for i, kv in enumerate(kvs):
        kv.page_ids = [pool.page_ids[i]]  # one one-token page each, in one pool
    ids = torch.zeros(num_seqs, dtype=torch.long, device=weight.device)
    return ids, [SeqSlice(i, i + 1, kv) for i, kv in enumerate(kvs)]
