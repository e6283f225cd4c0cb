"""`BatchPlan`: the index tensors of one forward over paged KV, made once and read by every layer,
and `attend`, the attention core each layer runs over it.

Attention runs over a padded batch of *rows*. A row is up to `q_tile` consecutive new tokens of
one sequence; it attends over that sequence's pages gathered in page-table order, up to its last
query. Rows sorted by their page count are cut into at most MAX_KEY_GROUPS *key groups*, each
padded with the zero page (masked out) to its own longest row, one attention call each. The
tile trades query padding against gathers: decodes alone use q_tile = 1 (one row per sequence,
no query padding); a long prefill chunk beside decodes is cut into several rows so the decodes
are not padded to its length. `_pick_q_tile` chooses it from a cost model (see there).

`attend` stores the new tokens' K/V, then attends for every sequence of the step (prefill chunks
and decodes side by side). Per layer: `index_copy_` writes the new K/V into their pool slots; one
`index_select` gathers every group's pages (keys and values, head by head) from the pool into the
plan's reused buffer, group after group, each then a padded batch [rows, kv_heads, keys,
head_dim] with each (row, head) contiguous; one `ops.masked_attention` call per group.
A query group (the query heads that share a kv head) is folded into query rows, so K/V are never
repeated per query head. A lone sequence starting at position 0 attends to its own new K/V
(causal, nothing to gather); a lone sequence whose pages are one run of the pool (lowest ids
first: the usual batch-1 case) attends to a view of that run, nothing gathered either. On an fp32
CPU pool where the model asks for it (`fused_decode`, decided at load), a step of one new token
per sequence skips all of this: its writes and attention are one call of our own per layer
(`cpu_kernels.decode_attend` for one sequence, `decode_attend_rows` for several), reading each
sequence's pages in place.

What this costs on CPU is in docs/kv_cache.md (measured against the old per-sequence calls).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from runtime.memory.kv_pool import SequenceKV
from runtime.models import ops

# a gather may take more rows than sequences up to this size (or one layer of the pool, if less)
GATHER_BUDGET_BYTES = 16 << 20
# rows of very different lengths are cut into at most this many key groups (see _key_group_cuts)
MAX_KEY_GROUPS = 4
MAX_CUT_CANDIDATES = 64
# one more attention call, in _pick_q_tile's cost units (a gathered key vector weighs 8): a
# small SDPA call plus its views costs ~15 us on CPU, the time of ~6,000 such units (measured:
# 32 decode rows over 24 pages of 16 keys, 4 kv heads, 1.2 ms a layer)
KEY_GROUP_CALL_COST = 8192


@dataclass
class SeqSlice:
    start: int  # this sequence's new tokens are input_ids[start:end] of the packed batch
    end: int
    kv: SequenceKV  # positions of the new tokens = kv.num_tokens + arange(end - start)


@dataclass
class KeyGroup:
    """Rows padded to the same number of keys: one gather block and one attention call."""

    first_row: int  # rows [first_row, first_row + num_rows) in the plan's group order
    num_rows: int
    num_keys: int  # key positions per row (its longest row's pages * page_size)
    table_offset: int  # its block starts at kv_table[table_offset]
    mask: Tensor  # [num_rows, 1, q_tile * group or 1, num_keys] True = attend


@dataclass
class BatchPlan:
    pool: Tensor  # [num_layers, 2, kv_heads, num_pages, page_size, head_dim]
    positions: Tensor  # [T] absolute position of every packed token
    write_slots: Tensor  # [T] page * page_size + offset: where each new token's K/V goes
    num_rows: int
    q_tile: int  # query tokens per row
    key_groups: list[KeyGroup]  # the rows in order of their keys, one attention call per group
    # the groups' pages (zero-page padded) in a layer's [2 * kv_heads * num_pages] page view:
    # group after group, each [2 * kv_heads, its rows * its pages] (keys then values, by head)
    kv_table: Tensor
    gather_out: Tensor | None  # [len(kv_table), page_size * head_dim] reused by every layer
    # [num_rows * q_tile] packed token of each query slot (rows in group order), and [T] query
    # slot of each packed token; None when row r is token r (decodes, one group, in order)
    query_index: Tensor | None
    output_index: Tensor | None
    single_prefill: bool  # one sequence from position 0: its new K/V are all it attends to
    # one sequence whose pages are consecutive in the pool (first page, pages, tokens before the
    # new ones): it attends to a view of the pool, nothing gathered (batch-1 decode, usually)
    lone_run: tuple[int, int, int] | None = None
    # a lone sequence's one-token step on an fp32 CPU pool of a model that asks for it (`build`):
    # its K/V write and attention are one call (cpu_kernels.decode_attend), over its page table
    # in any order (a prefix from the cache is rarely one run with the pages after it)
    fused_decode: bool = False
    # with fused_decode: the sequence's page table (the pages its tokens use) and its tokens
    # before the new one
    lone_pages: tuple[list[int], int] | None = None
    # a decode step of several sequences, one new token each, where fused_decode's conditions
    # hold otherwise: every row's K/V write and attention in one call
    # (cpu_kernels.decode_attend_rows): the rows' page tables one after another, where each
    # starts (one more than rows), and each row's tokens before its new one
    fused_rows: tuple[list[int], list[int], list[int]] | None = None

    @classmethod
    def build(
        cls, seqs: Sequence[SeqSlice], input_ids: Tensor, group: int, *, fused_decode: bool = False
    ) -> BatchPlan:
        """`group` = query heads per kv head: the mask repeats per head of a group (the model
        folds a group's heads into query rows) and the tile cost model weighs queries by it.
        `fused_decode`: the model's (`CausalLM.fused_decode`): a lone sequence's one-token step
        on an fp32 CPU pool then attends in one call (runtime.models.cpu_kernels.decode_attend)."""
        if not seqs:
            raise ValueError("a forward needs at least one sequence")
        pool, size = seqs[0].kv.data, seqs[0].kv.page_size
        num_kv_heads, head_dim = int(pool.shape[2]), int(pool.shape[5])
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
        single_prefill = len(seqs) == 1 and seqs[0].kv.num_tokens == 0
        fusable = (
            fused_decode
            and len(positions) == len(seqs)  # one new token a sequence
            and pool.dtype == torch.float32
            and pool.device.type == "cpu"
            and pool.is_contiguous()  # the kernels index the pool's memory themselves
        )
        fused = fusable and len(seqs) == 1 and not single_prefill
        fused_rows = _fused_rows(seqs, pages) if fusable and len(seqs) > 1 else None
        # a fused step reads its page tables itself: no run to look for, no gather to plan
        lone = not (single_prefill or fused or len(seqs) > 1)
        lone_run = _lone_run(seqs[0].kv, pages[0]) if lone else None
        key_groups: list[KeyGroup] = []
        kv_table, gather_out = tensor([]), None
        query_index = output_index = None
        if not (single_prefill or lone_run is not None or fused or fused_rows or not rows):
            key_groups, kv_table, gather_out, query_index, output_index = _grouped(
                seqs, rows, pages, q_tile, group, len(positions)
            )
        return cls(
            pool=pool,
            positions=tensor(positions),
            write_slots=tensor(slots),
            num_rows=len(rows),
            q_tile=q_tile,
            key_groups=key_groups,
            kv_table=kv_table,
            gather_out=gather_out,
            query_index=query_index,
            output_index=output_index,
            single_prefill=single_prefill,
            lone_run=lone_run,
            fused_decode=fused,
            lone_pages=(seqs[0].kv.page_ids[: pages[0]], positions[0]) if fused else None,
            fused_rows=fused_rows,
        )


def _fused_rows(
    seqs: Sequence[SeqSlice], pages: list[int]
) -> tuple[list[int], list[int], list[int]]:
    """decode_attend_rows' tables, their starts and the rows' past tokens."""
    flat: list[int] = []
    starts = [0]
    for seq, count in zip(seqs, pages, strict=True):
        flat.extend(seq.kv.page_ids[:count])
        starts.append(len(flat))
    return flat, starts, [seq.kv.num_tokens for seq in seqs]


def _key_group_cuts(sorted_pages: Sequence[int], unit: int) -> list[int]:
    """Boundaries [0, ..., n] cutting rows sorted by pages into at most MAX_KEY_GROUPS groups,
    each padded to its own longest row instead of all to the longest of the step. A group
    costs its rows x its pages x `unit` (the gathered keys and values and the scores over them)
    plus KEY_GROUP_CALL_COST for its attention call; the cuts minimise the sum (exactly, by
    dynamic programming over at most MAX_CUT_CANDIDATES places where the page count changes)."""
    n = len(sorted_pages)
    places = [i for i in range(1, n) if sorted_pages[i] != sorted_pages[i - 1]]
    if len(places) > MAX_CUT_CANDIDATES:  # spread evenly over the changes
        step = len(places) / MAX_CUT_CANDIDATES
        places = [places[int(k * step)] for k in range(MAX_CUT_CANDIDATES)]
    ends = [*places, n]  # group ends; a group [a, b) pads to sorted_pages[b - 1]

    def cost(a: int, b: int) -> int:
        return (b - a) * sorted_pages[b - 1] * unit + KEY_GROUP_CALL_COST

    # best[k][e]: least cost of rows [0, ends[e]) in k + 1 groups; back[k][e]: start index
    best = [[cost(0, end) for end in ends]]
    back = [[0] * len(ends)]
    for _ in range(1, MAX_KEY_GROUPS):
        prev, row, links = best[-1], [], []
        for e, end in enumerate(ends):
            choice, link = prev[e], -1  # as many groups as before: no new cut
            for c in range(e):  # the last group starts after ends[c]
                total = prev[c] + cost(ends[c], end)
                if total < choice:
                    choice, link = total, c
            row.append(choice)
            links.append(link)
        best.append(row)
        back.append(links)
    cuts = [n]
    k, e = len(best) - 1, len(ends) - 1
    while k > 0:
        c = back[k][e]
        if c >= 0:
            cuts.append(ends[c])
            e = c
        k -= 1
    return [0, *reversed(cuts)]


def _grouped(
    seqs: Sequence[SeqSlice],
    rows: list[tuple[int, int, int]],
    pages: list[int],
    q_tile: int,
    group: int,
    num_tokens: int,
) -> tuple[list[KeyGroup], Tensor, Tensor, Tensor | None, Tensor | None]:
    """The key groups of `rows` ((sequence, first new token, tokens) each), their page table
    and gather buffer, and the query order (None, None when row r is token r)."""
    pool, size = seqs[0].kv.data, seqs[0].kv.page_size
    num_kv_heads, num_pages, head_dim = int(pool.shape[2]), int(pool.shape[3]), int(pool.shape[5])
    device = pool.device

    def tensor(values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    # a row's keys end at its last query; rows sorted by that, then cut into key groups
    needed = [-(-(seqs[s].kv.num_tokens + j + n) // size) for s, j, n in rows]
    order = sorted(range(len(rows)), key=needed.__getitem__)
    unit = size * num_kv_heads * (8 + q_tile * group)  # _pick_q_tile's weights, per page
    cuts = _key_group_cuts([needed[r] for r in order], unit)
    if len(cuts) == 2:  # one group pads every row alike: keep the rows' order, nothing to permute
        order = list(range(len(rows)))
    heads = torch.arange(2 * num_kv_heads, device=device)[:, None] * num_pages
    tables: list[Tensor] = []
    key_groups: list[KeyGroup] = []
    order_index: list[int] = []
    query_pos: list[int] = []
    slot_of = [0] * num_tokens
    offset = 0
    for lo, hi in itertools.pairwise(cuts):
        group_pages = max(needed[r] for r in order[lo:hi])
        table_flat: list[int] = []
        first_pos = len(query_pos)
        for r in order[lo:hi]:
            s, j, n = rows[r]
            own = seqs[s].kv.page_ids[: min(pages[s], group_pages)]
            table_flat.extend(own)
            table_flat.extend([0] * (group_pages - len(own)))  # the zero page
            first, past = seqs[s].start + j, seqs[s].kv.num_tokens + j
            slot = len(order_index)
            slot_of[first : first + n] = range(slot, slot + n)
            order_index.extend(range(first, first + n))
            order_index.extend([first] * (q_tile - n))  # padding: a real token, dropped
            query_pos.extend(range(past, past + n))
            query_pos.extend([0] * (q_tile - n))  # position 0 sees key 0 only: no empty row
        num_keys = group_pages * size
        pos = tensor(query_pos[first_pos:]).view(hi - lo, q_tile, 1)
        allowed = torch.arange(num_keys, device=device) <= pos  # [rows, q_tile, keys]
        if q_tile == 1:
            mask = allowed[:, None]  # [rows, 1, 1, keys]: broadcast over a group's heads
        else:
            expanded = allowed[:, None, :, None].expand(-1, 1, -1, group, -1)
            mask = expanded.reshape(hi - lo, 1, q_tile * group, num_keys)
        block = (heads + tensor(table_flat)).view(-1)
        key_groups.append(KeyGroup(lo, hi - lo, num_keys, offset, mask))
        tables.append(block)
        offset += block.numel()
    kv_table = torch.cat(tables) if len(tables) > 1 else tables[0]
    scratch = seqs[0].kv.scratch
    numel = kv_table.numel() * size * head_dim
    flat = pool.new_empty(numel) if scratch is None else scratch.take(numel)
    gather_out = flat.view(kv_table.numel(), size * head_dim)
    # decodes in their own order: row r is token r, nothing to reorder
    if q_tile == 1 and order == list(range(len(rows))):
        return key_groups, kv_table, gather_out, None, None
    return key_groups, kv_table, gather_out, tensor(order_index), tensor(slot_of)


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
    if plan.fused_decode:  # the write and the attention in one call (its op: build's doc)
        assert plan.lone_pages is not None
        table, past = plan.lone_pages
        return torch.ops.fastllm_cpu.decode_attend(q, k, v, pool, table, past)
    if plan.fused_rows is not None:  # a decode step of several sequences, likewise
        return torch.ops.fastllm_cpu.decode_attend_rows(q, k, v, pool, *plan.fused_rows)
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
    rows, tile = plan.num_rows, plan.q_tile
    group = num_heads // num_kv_heads
    pages = pool.view(2 * num_kv_heads * num_pages, size * head_dim)
    assert plan.gather_out is not None and plan.key_groups
    torch.index_select(pages, 0, plan.kv_table, out=plan.gather_out)  # every group's block
    if plan.query_index is None:  # row r is token r
        queries = q.reshape(rows, num_kv_heads, group, head_dim)
    else:
        padded = q.index_select(0, plan.query_index)  # [rows * tile, Hq, D]
        padded = padded.view(rows, tile, num_kv_heads, group, head_dim).transpose(1, 2)
        queries = padded.reshape(rows, num_kv_heads, tile * group, head_dim)
    outs = []
    for part in plan.key_groups:
        block = plan.gather_out[part.table_offset :]
        block = block[: 2 * num_kv_heads * part.num_rows * (part.num_keys // size)]
        kv = block.view(2, num_kv_heads, part.num_rows, part.num_keys, head_dim).transpose(1, 2)
        mine = queries[part.first_row : part.first_row + part.num_rows]
        outs.append(ops.masked_attention(mine, kv[0], kv[1], part.mask))
    out = outs[0] if len(outs) == 1 else torch.cat(outs)  # [rows, Hkv, tile * group, D]
    if plan.query_index is None:
        return out.reshape(num_tokens, num_heads, head_dim)
    out = out.view(rows, num_kv_heads, tile, group, head_dim).transpose(1, 2)
    out = out.reshape(rows * tile, num_heads, head_dim)
    assert plan.output_index is not None
    return out.index_select(0, plan.output_index)
