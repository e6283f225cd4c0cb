"""`BatchPlan`: the index tensors of one forward over paged KV, made once and read by every layer,
and `attend`, the attention core each layer runs over it.

Attention runs as one call per layer over a padded batch of *rows*. A row is up to `q_tile`
consecutive new tokens of one sequence; it attends over that sequence's pages gathered in
page-table order (every row padded to the longest table with the zero page, masked out). The
tile trades query padding against gathers: decodes alone use q_tile = 1 (one row per sequence,
no query padding); a long prefill chunk beside decodes is cut into several rows so the decodes
are not padded to its length. `_pick_q_tile` chooses it from a cost model (see there).

`attend` stores the new tokens' K/V, then makes one attention call per layer for every sequence
of the step (prefill chunks and decodes side by side). Per layer: `index_copy_` writes the new K/V
into their pool slots; one `index_select` gathers the rows' pages (keys and values, head by head)
from the pool into the plan's reused buffer, which is then a padded batch [rows, kv_heads, keys,
head_dim] with each (row, head) contiguous; one `ops.masked_attention` call with the plan's mask.
A query group (the query heads that share a kv head) is folded into query rows, so K/V are never
repeated per query head. A lone sequence starting at position 0 attends to its own new K/V
(causal, nothing to gather); a lone sequence whose pages are one run of the pool (lowest ids
first: the usual batch-1 case) attends to a view of that run, nothing gathered either.

What this costs on CPU is in docs/kv_cache.md (measured against the old per-sequence calls).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from runtime.memory.kv_pool import SequenceKV
from runtime.models import ops

# a gather may take more rows than sequences up to this size (or one layer of the pool, if less)
GATHER_BUDGET_BYTES = 16 << 20


@dataclass
class SeqSlice:
    start: int  # this sequence's new tokens are input_ids[start:end] of the packed batch
    end: int
    kv: SequenceKV  # positions of the new tokens = kv.num_tokens + arange(end - start)


@dataclass
class BatchPlan:
    pool: Tensor  # [num_layers, 2, kv_heads, num_pages, page_size, head_dim]
    positions: Tensor  # [T] absolute position of every packed token
    write_slots: Tensor  # [T] page * page_size + offset: where each new token's K/V goes
    num_rows: int
    q_tile: int  # query tokens per row
    num_keys: int  # key positions per row (pages per row * page_size)
    # [2 * kv_heads * num_rows * pages per row]: the rows' pages (zero-page padded) in a layer's
    # [2 * kv_heads * num_pages] page view, for keys then values, head by head
    kv_table: Tensor
    gather_out: Tensor | None  # [len(kv_table), page_size * head_dim] reused by every layer
    # [num_rows * q_tile] packed token of each query slot, and [T] query slot of each packed
    # token; None when q_tile == 1 (row r is token r)
    query_index: Tensor | None
    output_index: Tensor | None
    mask: Tensor | None  # [num_rows, 1, q_tile * group, num_keys] True = attend; None: see below
    single_prefill: bool  # one sequence from position 0: its new K/V are all it attends to
    # one sequence whose pages are consecutive in the pool (first page, pages, tokens before the
    # new ones): it attends to a view of the pool, nothing gathered (batch-1 decode, usually)
    lone_run: tuple[int, int, int] | None = None

    @classmethod
    def build(cls, seqs: Sequence[SeqSlice], input_ids: Tensor, group: int) -> BatchPlan:
        """`group` = query heads per kv head: the mask repeats per head of a group (the model
        folds a group's heads into query rows) and the tile cost model weighs queries by it."""
        if not seqs:
            raise ValueError("a forward needs at least one sequence")
        pool, size = seqs[0].kv.data, seqs[0].kv.page_size
        num_kv_heads, num_pages, head_dim = (
            int(pool.shape[2]),
            int(pool.shape[3]),
            int(pool.shape[5]),
        )
        positions: list[int] = []
        slots: list[int] = []
        for seq in seqs:
            kv, n = seq.kv, seq.end - seq.start
            if seq.start != len(positions) or n < 0:
                raise ValueError(
                    f"seq slices must tile input_ids in order; got {seq.start}:{seq.end}"
                )
            if kv.data is not pool:
                raise ValueError("every sequence of a forward must use the same page pool")
            past, table = kv.num_tokens, kv.page_ids
            if past + n > kv.capacity:
                raise ValueError(f"KV overflow: {past} + {n} > capacity {kv.capacity}")
            positions.extend(range(past, past + n))
            slots.extend(table[p // size] * size + p % size for p in range(past, past + n))
        if len(positions) != input_ids.shape[0]:
            raise ValueError(
                f"seq slices cover {len(positions)} tokens, input has {input_ids.shape[0]}"
            )
        device = input_ids.device

        def tensor(values: list[int]) -> Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        lengths = [seq.end - seq.start for seq in seqs]
        pages = [-(-(seq.kv.num_tokens + n) // size) for seq, n in zip(seqs, lengths, strict=True)]
        pages_per_row = max(pages)
        # rows beyond one per sequence only while the gather stays within a bound (a long
        # context beside short ones pads every row to its table: see docs/kv_cache.md)
        row_bytes = pages_per_row * 2 * num_kv_heads * size * head_dim * pool.element_size()
        layer_bytes = pool[0].numel() * pool.element_size()  # a small pool, a small buffer
        budget = min(GATHER_BUDGET_BYTES, layer_bytes)
        max_rows = max(len(seqs), budget // max(row_bytes, 1))
        q_tile = _pick_q_tile(lengths, group, max_rows)
        rows = [
            (s, j, min(q_tile, n - j)) for s, n in enumerate(lengths) for j in range(0, n, q_tile)
        ]
        table_flat: list[int] = []
        query_index: list[int] = []
        query_pos: list[int] = []
        for s, j, n in rows:
            seq = seqs[s]
            table_flat.extend(seq.kv.page_ids[: pages[s]])
            table_flat.extend([0] * (pages_per_row - pages[s]))  # the zero page
            first, past = seq.start + j, seq.kv.num_tokens + j
            query_index.extend(range(first, first + n))
            query_index.extend([first] * (q_tile - n))  # padding: a real token, output dropped
            query_pos.extend(range(past, past + n))
            query_pos.extend([0] * (q_tile - n))  # position 0 sees key 0 only: no empty row
        single_prefill = len(seqs) == 1 and seqs[0].kv.num_tokens == 0
        lone_run = None if single_prefill or len(seqs) > 1 else _lone_run(seqs[0].kv, pages[0])
        mask = None
        if not single_prefill and lone_run is None and rows:
            num_keys = pages_per_row * size
            pos = tensor(query_pos).view(len(rows), q_tile, 1)
            allowed = torch.arange(num_keys, device=device) <= pos  # [rows, q_tile, keys]
            if q_tile == 1:
                mask = allowed[:, None]  # [rows, 1, 1, keys]: broadcast over a group's heads
            else:
                expanded = allowed[:, None, :, None].expand(-1, 1, -1, group, -1)
                mask = expanded.reshape(len(rows), 1, q_tile * group, num_keys)
        kv_table = gather_out = None
        if not single_prefill and lone_run is None:
            rows_pages = tensor(table_flat)
            heads = torch.arange(2 * num_kv_heads, device=device)[:, None] * num_pages
            kv_table = (heads + rows_pages).view(-1)
            scratch = seqs[0].kv.scratch
            numel = kv_table.numel() * size * head_dim
            flat = pool.new_empty(numel) if scratch is None else scratch.take(numel)
            gather_out = flat.view(kv_table.numel(), size * head_dim)
        output_index = None
        if q_tile > 1:
            slot_of = [0] * len(positions)
            for r, (s, j, n) in enumerate(rows):
                first = seqs[s].start + j
                slot_of[first : first + n] = range(r * q_tile, r * q_tile + n)
            output_index = tensor(slot_of)
        return cls(
            pool=pool,
            positions=tensor(positions),
            write_slots=tensor(slots),
            num_rows=len(rows),
            q_tile=q_tile,
            num_keys=pages_per_row * size,
            kv_table=kv_table if kv_table is not None else tensor([]),
            gather_out=gather_out,
            query_index=tensor(query_index) if q_tile > 1 else None,
            output_index=output_index,
            mask=mask,
            single_prefill=single_prefill,
            lone_run=lone_run,
        )


def _lone_run(kv: SequenceKV, num_pages: int) -> tuple[int, int, int] | None:
    """Pages are handed out lowest id first, so a lone sequence's table is often one run."""
    table = kv.page_ids[:num_pages]
    first = table[0]
    if table[-1] - first != num_pages - 1 or any(p != first + i for i, p in enumerate(table)):
        return None
    return first, num_pages, kv.num_tokens


def _pick_q_tile(lengths: Sequence[int], group: int, max_rows: int) -> int:
    """The query tile with the least estimated work among those giving at most `max_rows` rows
    (the gather buffer holds rows x the longest page table; more rows, more memory). Per row
    and key position a row pays one gathered key and value (weighted 8: a copy costs more than a
    multiply-add here) plus one score and one weighted value per query head (tile * group per
    kv head). The largest tile (one row per sequence) is always allowed."""
    longest = max(lengths)
    best, best_cost = longest, None
    tile = 1
    while True:
        rows = sum(-(-n // tile) for n in lengths)
        cost = rows * (8 + tile * group)
        if rows <= max_rows and (best_cost is None or cost < best_cost):
            best, best_cost = tile, cost
        if tile >= longest:
            return best
        tile *= 2


def attend(plan: BatchPlan, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D] (rotated) -> [T, Hq, D]; stores k/v in the pool first."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    pool = plan.pool[layer]  # [2, kv_heads, num_pages, page_size, head_dim]
    num_pages, size = pool.shape[2], pool.shape[3]
    slots = pool.view(2, num_kv_heads, num_pages * size, head_dim)
    slots[0].index_copy_(1, plan.write_slots, k.transpose(0, 1))
    slots[1].index_copy_(1, plan.write_slots, v.transpose(0, 1))
    if plan.single_prefill:
        out = ops.attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), causal_offset=0
        )
        return out.transpose(0, 1)
    if plan.lone_run is not None:  # one sequence, its pages one run: a view, no gather
        first, count, past = plan.lone_run
        total = past + num_tokens
        run_k = pool[0].narrow(1, first, count).reshape(num_kv_heads, count * size, head_dim)
        run_v = pool[1].narrow(1, first, count).reshape(num_kv_heads, count * size, head_dim)
        out = ops.attention(
            q.transpose(0, 1), run_k[:, :total], run_v[:, :total], causal_offset=past
        )
        return out.transpose(0, 1)
    rows, tile, keys = plan.num_rows, plan.q_tile, plan.num_keys
    group = num_heads // num_kv_heads
    pages = pool.view(2 * num_kv_heads * num_pages, size * head_dim)
    assert plan.gather_out is not None and plan.mask is not None
    torch.index_select(pages, 0, plan.kv_table, out=plan.gather_out)
    kv = plan.gather_out.view(2, num_kv_heads, rows, keys, head_dim).transpose(1, 2)
    if tile == 1:  # row r is token r
        queries = q.reshape(rows, num_kv_heads, group, head_dim)
    else:
        assert plan.query_index is not None
        padded = q.index_select(0, plan.query_index)  # [rows * tile, Hq, D]
        padded = padded.view(rows, tile, num_kv_heads, group, head_dim).transpose(1, 2)
        queries = padded.reshape(rows, num_kv_heads, tile * group, head_dim)
    out = ops.masked_attention(queries, kv[0], kv[1], plan.mask)  # [rows, Hkv, tile * group, D]
    if tile == 1:
        return out.reshape(num_tokens, num_heads, head_dim)
    out = out.view(rows, num_kv_heads, tile, group, head_dim).transpose(1, 2)
    out = out.reshape(rows * tile, num_heads, head_dim)
    assert plan.output_index is not None
    return out.index_select(0, plan.output_index)
