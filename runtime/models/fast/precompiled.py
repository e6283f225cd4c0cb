"""A compiled graph saved to one file and loaded back without tracing: what makes a restart cheap.

torch.compile's own on-disk caches (inductor's FX graph cache, AOT autograd's) still leave dynamo
to trace the step again on every start, and for a 30-layer model that tracing was most of a 28 s
warm restart (3.3x the eager load). torch's precompile API (`torch.compile(...).aot_compile`,
experimental in torch 2.13) captures a graph once and serializes what a call needs (dynamo's
bytecode and guards, inductor's generated code) into one file, and
`torch.compiler.load_compiled_function` reads it back with no tracing and no compiling: what is
left of a warm start is importing inductor's runtime and loading its built kernels.

A saved graph is reused only when all of these hold, else the caller compiles afresh and
overwrites it:
  - it deserializes (torch refuses another python or torch version);
  - its name matches the model's tensors (`layout_key`) and its guards accept the example
    inputs (the token count's range, the inputs' dtypes: a different checkpoint compiles again);
  - every module it traced still has the source it had when saved (an edit to the model's
    code compiles again: guards do not see code).
Files are written atomically (a temporary file renamed), so a second process starting on the
same directory reads the old file or the new one, never half of one.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from torch import Tensor

log = logging.getLogger(__name__)

_SUFFIX = ".graph"
MODEL_ARG = "model"  # the traced function's first parameter: the model, its weights inside


class Graph(Protocol):
    """What `torch.compile(...).aot_compile` returns (torch's AOTCompiledFunction)."""

    def __call__(self, *args: Any) -> Tensor: ...

    def guard_check(self, *args: Any) -> bool: ...

    def save_compiled_function(self, path: str) -> object: ...

    def source_info(self) -> Any: ...


class StaleGraph(Exception):
    """A saved graph that must not serve these inputs (why: the message)."""


def graph_path(directory: Path, name: str) -> Path:
    return directory / f"{name}{_SUFFIX}"


def precompile(
    fn: Callable[..., Tensor], example: tuple[Any, ...], options: dict[str, Any]
) -> Graph:
    """`fn` compiled by inductor for inputs like `example` (dynamic shapes: 0/1 specialised as
    torch.compile does), as one graph with no breaks. Floats are specialised: a model's float
    attributes (norm eps, attention scale) turned into symbols make the capture restart, which
    the one-shot capture cannot do; they are constants of a loaded model anyway."""
    options = {**options, "guard_filter_fn": _kept_guards}
    compiled: Any = torch.compile(fn, dynamic=True, fullgraph=True, options=options)
    with torch._dynamo.config.patch(specialize_float=True):
        graph: Graph = compiled.aot_compile((example, {}))
    return graph


def _kept_guards(entries: Sequence[Any]) -> list[bool]:
    """The guards saved with a graph: torch's default for a saved graph (none on globals, none
    that cannot be serialized) less two kinds:
      - the global state's, which compares the intra-op thread count with the one at compile:
        the kernels read it at run time (`cpp.dynamic_threads`) and the engine sets it per step
        (the grad mode it also covers is inference mode at every call);
      - those on the model argument (`MODEL_ARG`): one per parameter and attribute, ~7,700 for
        a 30-layer int4 model, whose rebuilding was the largest part of a warm start (5 of
        17 s). What they check (the tensors' shapes, dtypes and strides; the config's numbers)
        the graph's file name holds instead (`layout_key`; the directory's key has the files)."""
    from torch._dynamo.guards import CheckFunctionManager  # at compile only: a heavy import

    unsupported = set(getattr(CheckFunctionManager, "UNSUPPORTED_SERIALIZATION_GUARD_TYPES", ()))
    return [
        not (
            e.is_global
            or e.guard_type in unsupported
            or e.guard_type == "GLOBAL_STATE"
            or e.name.startswith(f"L['{MODEL_ARG}']")
        )
        for e in entries
    ]


def layout_key(module: torch.nn.Module) -> str:
    """12 hex digits over the module's tensors as the graph sees them: names, shapes, dtypes,
    strides (what the dropped guards on the model compared)."""
    digest = hashlib.sha256()
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}:{tensor.stride()};".encode())
    # a quantized layer's copy for the AVX2 kernels (runtime.models.cpu_kernels) is an attribute,
    # not a buffer: a graph traced with it calls those kernels, one traced without calls torch's
    for name, layer in module.named_modules():
        for i, tensor in enumerate(getattr(layer, "gemv", ())):
            digest.update(f"{name}.gemv{i}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
    return digest.hexdigest()[:12]


def save(graph: Graph, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    graph.save_compiled_function(str(path))


def load(path: Path, example: tuple[Any, ...]) -> Graph:
    """The graph saved at `path`, checked against `example`; StaleGraph when it must not be
    used (missing, unreadable, from another torch, its guards or its sources changed)."""
    if not path.is_file():
        raise StaleGraph("not saved yet")
    try:
        with path.open("rb") as file:
            graph = cast(Graph, torch.compiler.load_compiled_function(file))
    except Exception as exc:  # torch's own checks (versions) and any corrupt file alike
        raise StaleGraph(f"unreadable ({type(exc).__name__}: {exc})") from exc
    changed = _changed_sources(graph)
    if changed:
        raise StaleGraph(f"source changed: {', '.join(sorted(changed))}")
    if not graph.guard_check(*example):
        raise StaleGraph("its guards reject this model's inputs")
    return graph


def _changed_sources(graph: Graph) -> set[str]:
    """Modules traced into the graph whose source is not what it was at save."""
    changed = set()
    for source in graph.source_info().inlined_sources:
        try:
            current = inspect.getsource(importlib.import_module(source.module))
        except (ImportError, OSError, TypeError):
            current = None
        if current != source.content:
            changed.add(source.module)
    return changed
