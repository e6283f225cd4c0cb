"""Finding and reading checkpoint tensors: safetensors (mmap, single file or sharded with
`model.safetensors.index.json`), and under legacy support `pytorch_model.bin` read with
`torch.load(weights_only=True, mmap=True)`. Tensors are read one at a time, on demand, so the
loader can check names and shapes before touching data."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor

from runtime.errors import ModelLoadError, UnsafeCheckpointError
from runtime.models.side_files import named_inside

SAFETENSORS_INDEX = "model.safetensors.index.json"
log = logging.getLogger("fastllm.models")
LEGACY_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


class TensorSource:
    """name -> tensor over one or more files; `shape` reads only headers."""

    def __init__(self, handles: dict[str, Any], is_legacy: bool, metadata: dict[str, str]) -> None:
        self._handles = handles  # tensor name -> safe_open handle, or the tensor itself (legacy)
        self.is_legacy = is_legacy
        self.metadata = metadata

    def names(self) -> list[str]:
        return list(self._handles)

    def shape(self, name: str) -> tuple[int, ...]:
        handle = self._handles[name]
        if isinstance(handle, Tensor):
            return tuple(handle.shape)
        return tuple(handle.get_slice(name).get_shape())

    def get(self, name: str) -> Tensor:
        handle = self._handles[name]
        if isinstance(handle, Tensor):
            return handle
        try:
            return handle.get_tensor(name)
        except Exception as exc:  # safetensors raises its own error types for bad data
            raise ModelLoadError(f"corrupt safetensors data for tensor {name!r}: {exc}") from exc

    def get_narrow(self, name: str, dim: int, start: int, length: int) -> Tensor:
        """`get(name).narrow(dim, start, length)` reading only that slice where the file allows
        (safetensors: a sliced read of the mmap; a legacy tensor: a view of it). Sources whose
        tensors must be decoded whole (GGUF) decode, then narrow. Tensor-parallel loading."""
        handle = self._handles.get(name)
        if isinstance(handle, Tensor):
            return handle.narrow(dim, start, length)
        if handle is not None and hasattr(handle, "get_slice"):
            index = (slice(None),) * dim + (slice(start, start + length),)
            try:
                return handle.get_slice(name)[index]
            except Exception as exc:
                raise ModelLoadError(
                    f"corrupt safetensors data for tensor {name!r}: {exc}"
                ) from exc
        return self.get(name).narrow(dim, start, length)


def safetensors_files(path: Path) -> list[Path]:
    """The weight files of a checkpoint directory (empty if it has no safetensors)."""
    index = path / SAFETENSORS_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelLoadError(f"invalid {index}: {exc}") from exc
        shards = [named_inside(path, f, source=index) for f in files]
        missing = [f for f, shard in zip(files, shards, strict=True) if not shard.is_file()]
        if missing:
            raise ModelLoadError(f"{index} names missing shard file(s): {', '.join(missing)}")
        return shards
    single = path / "model.safetensors"
    return [single] if single.is_file() else sorted(path.glob("*.safetensors"))


def open_checkpoint(path: Path, *, legacy_support: bool) -> TensorSource:
    files = safetensors_files(path)
    if files:
        return _open_safetensors(files)
    legacy = [path / name for name in LEGACY_FILES if (path / name).is_file()]
    if legacy and not legacy_support:
        raise ModelLoadError(
            f"{path} holds only a legacy pytorch_model.bin checkpoint; convert it with "
            f"`fastllm convert --input {path} --output OUT_DIR` (or enable legacy_support)"
        )
    if legacy:
        log.warning(
            "%s: loading a legacy pytorch_model.bin (legacy_support, weights_only=True); convert "
            "it with `fastllm convert --input %s --output OUT_DIR`",
            path,
            path,
        )
        return _open_torch_bin(path)
    raise ModelLoadError(f"no *.safetensors weights in {path}")


def _open_safetensors(files: list[Path]) -> TensorSource:
    handles: dict[str, Any] = {}
    metadata: dict[str, str] = {}
    for file in files:
        try:
            handle = safe_open(str(file), framework="pt", device="cpu")  # mmap-backed
            names = list(handle.keys())
            metadata.update(handle.metadata() or {})
        except Exception as exc:
            raise ModelLoadError(f"corrupt safetensors file {file}: {exc}") from exc
        for name in names:
            handles[name] = handle
    return TensorSource(handles, is_legacy=False, metadata=metadata)


def _open_torch_bin(path: Path) -> TensorSource:
    index = path / "pytorch_model.bin.index.json"
    try:
        files = (
            sorted(set(json.loads(index.read_text())["weight_map"].values()))
            if index.is_file()
            else []
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelLoadError(f"invalid {index}: {exc}") from exc
    tensors: dict[str, Any] = {}
    shards = [named_inside(path, f, source=index) for f in files]
    for file in shards or [path / "pytorch_model.bin"]:
        tensors.update(_torch_load(file))
    return TensorSource(tensors, is_legacy=True, metadata={})


def _torch_load(file: Path) -> dict[str, Tensor]:
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:  # weights_only refused a global: code in the pickle
        raise UnsafeCheckpointError(f"{file} is not a plain tensor checkpoint: {exc}") from exc
    except Exception as exc:
        raise ModelLoadError(f"corrupt checkpoint file {file}: {exc}") from exc
    if not isinstance(state, dict) or not all(isinstance(t, Tensor) for t in state.values()):
        raise ModelLoadError(f"{file} does not hold a flat name -> tensor state dict")
    return state
