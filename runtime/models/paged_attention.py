"""The attention core over paged KV: store the new tokens' K/V, then one attention call per layer
for every sequence of the step (prefill chunks and decodes side by side), as `BatchPlan` lays out.

Per layer: one `index_copy_` writes the new K/V into their pool slots; one `index_select` gathers
the rows' pages (keys and values together) from the pool into a padded batch; one
`scaled_dot_product_attention` call with the plan's mask. A query group (the query heads that
share a kv head) is folded into query rows, so K/V are never repeated per query head. A lone
sequence starting at position 0 attends to its own new K/V (causal, nothing to gather).

Measured on the 2-core CPU dev box (thread time, small llama: 8 q / 4 kv heads, head_dim 64) for
32 decodes of 40-384 tokens, one layer: the gather of 2 x 11.5 MiB ~4.4 ms, the batched call
~6.5 ms; the old form, one SDPA per sequence over contiguous per-sequence KV, ~4-6 ms. Decodes
pay the gather here; the batched form pays off where a call costs more than its work (CUDA
launches), and it is the interface a paged kernel can take over. See docs/kv_cache.md.
"""

from __future__ import annotations

from torch import Tensor

from runtime.models import ops
from runtime.models.batch_plan import BatchPlan


def attend(plan: BatchPlan, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D] (rotated) -> [T, Hq, D]; stores k/v in the pool first."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    pool = plan.pool[layer]  # [2, num_pages, block_size, kv_heads, head_dim]
    num_pages, size = pool.shape[1], pool.shape[2]
    slots = pool.view(2, num_pages * size, num_kv_heads, head_dim)
    slots[0].index_copy_(0, plan.write_slots, k)
    slots[1].index_copy_(0, plan.write_slots, v)
    if plan.single_prefill:
        out = ops.attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), causal_offset=0
        )
        return out.transpose(0, 1)
    rows, tile, keys = plan.num_rows, plan.q_tile, plan.num_keys
    group = num_heads // num_kv_heads
    pages = pool.view(2 * num_pages, size * num_kv_heads * head_dim)
    gathered = pages.index_select(0, plan.kv_table)  # keys' pages, then values' pages
    kv = gathered.view(2, rows, keys, num_kv_heads, head_dim).transpose(2, 3)
    if tile == 1:  # row r is token r
        queries = q.reshape(rows, num_kv_heads, group, head_dim)
    else:
        assert plan.query_index is not None
        padded = q.index_select(0, plan.query_index)  # [rows * tile, Hq, D]
        padded = padded.view(rows, tile, num_kv_heads, group, head_dim).transpose(1, 2)
        queries = padded.reshape(rows, num_kv_heads, tile * group, head_dim)
    assert plan.mask is not None
    out = ops.masked_attention(queries, kv[0], kv[1], plan.mask)
    if tile == 1:
        return out.reshape(num_tokens, num_heads, head_dim)
    out = out.view(rows, num_kv_heads, tile, group, head_dim).transpose(1, 2)
    out = out.reshape(rows * tile, num_heads, head_dim)
    assert plan.output_index is not None
    return out.index_select(0, plan.output_index)
