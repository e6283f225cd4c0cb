"""`meta_build`: modules built on the `meta` device with their parameter init skipped.

A model is built on `meta` and every tensor is then replaced by `load_state_dict(assign=True)`,
so the random init of `nn.Linear`/`nn.Embedding` computes nothing that survives. It is not free
either: a meta tensor's `normal_` runs torch's Python reference (`torch._refs.normal_`), whose
`_disable_dynamo` wrapper imports `torch._dynamo`, ~1-2 s of CPU on every process that loads a
model even with compile off. Skipping the init on meta tensors only (which hold no data) changes
no result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

__all__ = ["meta_build"]

# nn.init's functions (those that dispatch to a torch-function mode themselves reach the mode
# before the device mode; the others reach it as the Tensor fills below)
_INIT_FUNCS: frozenset[Callable[..., Any]] = frozenset(
    getattr(nn.init, name)
    for name in dir(nn.init)
    if name.endswith("_") and not name.startswith("_") and callable(getattr(nn.init, name))
)
_RANDOM_FILLS: frozenset[Callable[..., Any]] = frozenset(
    getattr(Tensor, name)
    for name in (
        "normal_",
        "uniform_",
        "random_",
        "bernoulli_",
        "exponential_",
        "geometric_",
        "log_normal_",
        "cauchy_",
    )
)
_SKIPPED = _INIT_FUNCS | _RANDOM_FILLS


class _SkipMetaInit(TorchFunctionMode):
    """An init or random fill of a meta tensor returns the tensor untouched."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _SKIPPED:
            target = args[0] if args else kwargs.get("tensor", kwargs.get("self"))
            if isinstance(target, Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)


@contextmanager
def meta_build() -> Iterator[None]:
    """Inside: modules are created on `meta` without parameter init (thread-local, as torch's
    function modes are), for `load_state_dict(assign=True)` to fill."""
    with torch.device("meta"), _SkipMetaInit():
        yield
