"""A checkpoint as one tensor-parallel rank sees it: `ShardedSource` yields that rank's slices
of each tensor (runtime.models.parallel.shard says which), `open_source` opens any checkpoint
(HF directory or GGUF file) with its full args."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from runtime.models.checkpoint import TensorSource, open_checkpoint
from runtime.models.config import ModelArgs
from runtime.models.gguf_io.reader import is_gguf
from runtime.models.loader import read_args
from runtime.models.parallel.shard import ShardSpec, slice_of, sliced_shape


class ShardedSource(TensorSource):
    """A checkpoint seen through one rank's slices: names as stored, shapes and data sliced."""

    def __init__(self, source: TensorSource, args: ModelArgs, spec: ShardSpec) -> None:
        super().__init__({}, is_legacy=source.is_legacy, metadata=source.metadata)
        self.source, self.args, self.spec = source, args, spec

    def names(self) -> list[str]:
        return self.source.names()

    def shape(self, name: str) -> tuple[int, ...]:
        full = self.source.shape(name)
        return sliced_shape(full, slice_of(self.args, name, full, self.spec))

    def get(self, name: str) -> Tensor:
        full = self.source.shape(name)
        piece = slice_of(self.args, name, full, self.spec)
        if piece is None:
            return self.source.get(name)
        if piece.zero:
            return torch.zeros(full)
        return self.source.get_narrow(name, piece.dim, piece.start, piece.length)


def open_source(path: Path, legacy_support: bool) -> tuple[ModelArgs, TensorSource, object]:
    """The checkpoint's full args, its tensor source and (GGUF) the open file, else None."""
    if is_gguf(path):
        from runtime.models.gguf_io.args import model_args
        from runtime.models.gguf_io.reader import open_gguf
        from runtime.models.gguf_io.source import GGUFSource

        file = open_gguf(path)
        full_args = model_args(file)
        return full_args, GGUFSource(file, full_args), file
    return read_args(path), open_checkpoint(path, legacy_support=legacy_support), None
