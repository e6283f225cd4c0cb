"""The attention core over paged KV: store the new tokens' K/V, then one attention call per layer
for every sequence of the step (prefill chunks and decodes side by side), as `BatchPlan` lays out.

Per layer: `index_copy_` writes the new K/V into their pool slots; one `index_select` gathers the
rows' pages (keys and values, head by head) from the pool into the plan's reused buffer, which is
then a padded batch [rows, kv_heads, keys, head_dim] with each (row, head) contiguous; one
`ops.masked_attention` call with the plan's mask. A query group (the query heads that share a kv
head) is folded into query rows, so K/V are never repeated per query head. A lone sequence
starting at position 0 attends to its own new K/V (causal, nothing to gather); a lone sequence
whose pages are one run of the pool (lowest ids first: the usual batch-1 case) attends to a view
of that run, nothing gathered either.

What this costs on CPU is in docs/kv_cache.md (measured against the old per-sequence calls).
"""

from __future__ import annotations

import torch
from torch import Tensor

from runtime.models import ops
from runtime.models.batch_plan import BatchPlan


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
