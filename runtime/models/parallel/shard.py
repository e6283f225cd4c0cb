"""Which slice of each checkpoint tensor a tensor-parallel rank holds (Megatron's split, as
gpt-fast's tp.py and nano-vllm lay it out):

    q/k/v, gate/up          column-parallel: rows (output features) split, heads whole per rank
    o_proj, down_proj       row-parallel: columns (input features) split; each rank's partial
                            product is summed by one all_reduce (runtime.models.parallel.comm)
    embeddings, norms,      replicated: every rank holds them whole. The LM head is replicated
    LM head                 rather than split over the vocabulary: only rank 0 computes logits
                            (it alone samples), so a split head would cost an all_gather per step
                            for nothing; the price is vocab x hidden per worker.

KV heads: split like the query heads when there are at least as many as ranks; fewer (gemma's
single KV head) are replicated, rank r using KV head r * kv // world, so the query heads it holds
still find their group's keys. A row-parallel bias is held by rank 0 only (zeros elsewhere): the
all_reduce adds it once.

Every rank's model is then an ordinary `CausalLM` built from `shard_args` (its heads and
intermediate size): the layers, the KV pool and the attention need no change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from runtime.errors import ConfigError
from runtime.models.config import ModelArgs

_COLUMN = re.compile(r"\.(self_attn\.(q|k|v)_proj|mlp\.(gate|up)_proj)\.(weight|bias)$")
_ROW = re.compile(r"\.(self_attn\.o_proj|mlp\.down_proj)\.(weight|bias)$")


@dataclass(frozen=True)
class ShardSpec:
    rank: int
    world: int

    @property
    def is_sharded(self) -> bool:
        return self.world > 1


@dataclass(frozen=True)
class Slice:
    """Rows or columns [start, start + length) of a tensor along `dim`; `zero`: a zero tensor of
    the full shape instead (a row-parallel bias on ranks > 0)."""

    dim: int
    start: int
    length: int
    zero: bool = False


def check_tp(args: ModelArgs, world: int) -> None:
    """One line naming what does not divide, before any process is started or weight read."""
    if world < 1:
        raise ConfigError(
            f"tensor_parallel_size must be >= 1, got {world}", param="tensor_parallel_size"
        )
    if world == 1:
        return
    if not args.is_causal_lm:
        raise ConfigError(
            f"tensor parallelism applies to decoder models, not {args.architecture}",
            param="tensor_parallel_size",
        )
    kv = args.num_kv_heads
    checks = (
        ("attention heads", args.num_heads, args.num_heads % world == 0),
        ("KV heads", kv, kv % world == 0 or world % kv == 0),
        ("intermediate size", args.intermediate_size, args.intermediate_size % world == 0),
    )
    for what, value, ok in checks:
        if not ok:
            raise ConfigError(
                f"tensor_parallel_size {world} does not divide the model's {value} {what}",
                param="tensor_parallel_size",
            )


def shard_args(args: ModelArgs, world: int) -> ModelArgs:
    """The shape of one rank's model: its heads, KV heads and intermediate size."""
    if world == 1:
        return args
    return replace(
        args,
        num_heads=args.num_heads // world,
        num_kv_heads=max(1, args.num_kv_heads // world),
        intermediate_size=args.intermediate_size // world,
    )


def slice_of(args: ModelArgs, name: str, shape: tuple[int, ...], spec: ShardSpec) -> Slice | None:
    """The slice of checkpoint tensor `name` (HF name, full `shape`) that `spec`'s rank holds;
    None: the whole tensor (replicated)."""
    if not spec.is_sharded:
        return None
    rank, world = spec.rank, spec.world
    column = _COLUMN.search(name)
    if column is not None:
        part = column.group(2) or column.group(3)
        if part in ("k", "v"):
            local = max(1, args.num_kv_heads // world)
            head = rank * args.num_kv_heads // world if args.num_kv_heads < world else rank * local
            return Slice(0, head * args.head_dim, local * args.head_dim)
        length = shape[0] // world
        return Slice(0, rank * length, length)
    row = _ROW.search(name)
    if row is not None:
        if row.group(2) == "bias":  # added once, by rank 0's share of the sum
            return None if rank == 0 else Slice(0, 0, shape[0], zero=True)
        length = shape[1] // world
        return Slice(1, rank * length, length)
    return None


def sliced_shape(shape: tuple[int, ...], piece: Slice | None) -> tuple[int, ...]:
    if piece is None or piece.zero:
        return shape
    out = list(shape)
    out[piece.dim] = piece.length
    return tuple(out)
