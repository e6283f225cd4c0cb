// Batch-1 decode attention over one sequence's pages, in one call (runtime/models/cpu_kernels says
// why: on a CPU where every torch op costs microseconds, the eager path's ~12 ops a layer cost
// more than the attention itself at short contexts). The new token's K/V are written into the
// pool, then each query head attends to its KV head's `past + 1` positions: softmax(q k^T /
// sqrt(D)) v, in fp32, query heads grouped per KV head as in the model (head h serves h * group
// ...). The pages are the sequence's table, in any order: a prefix shared from the cache sits
// wherever it was first written, so a table is often not one run.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels.h"
#include "vec.h"

namespace fastllm_cpu {

void check_table(at::IntArrayRef pages, int64_t P, int64_t S, int64_t past) {
  TORCH_CHECK(past >= 0 && past / S < static_cast<int64_t>(pages.size()),
              "the new token's slot lies outside the pool: position ", past, " past a table of ",
              pages.size(), " pages");
  for (const int64_t page : pages) {
    TORCH_CHECK(page >= 0 && page < P, "the new token's slot lies outside the pool: page ", page,
                " of ", P);
  }
}

namespace {

// One sequence's pages in a layer's pool [2, Hkv, P, S, D]: position t of KV head h is page
// pages[t / S], slot t % S; keys are heads [0, Hkv) of the pool's first dimension's flattening,
// values [Hkv, 2 Hkv). `store` writes a token's K/V [Hkv, D] each at position `past`.
struct Table {
  float* base;
  int64_t Hkv, P, S, D;
  const int64_t* pages;

  float* key(int64_t h, int64_t t) const { return base + ((h * P + pages[t / S]) * S + t % S) * D; }
  float* value(int64_t h, int64_t t) const { return key(Hkv + h, t); }

  void store(const float* kp, const float* vp, int64_t past) const {
    for (int64_t h = 0; h < Hkv; ++h) {
      std::memcpy(key(h, past), kp + h * D, D * sizeof(float));
      std::memcpy(value(h, past), vp + h * D, D * sizeof(float));
    }
  }

  // query head hq of q [Hq, D] over positions [0, total) -> out [Hq, D]'s row hq; `scores`
  // holds `total` floats
  void attend_head(const float* qp, int64_t hq, int64_t group, int64_t total, float* scores,
                   float* op) const {
    const float scale = 1.f / std::sqrt(static_cast<float>(D));
    const float* qh = qp + hq * D;
    const int64_t hk = hq / group;
    float top = -std::numeric_limits<float>::infinity();
    // page by page: a page's S positions are contiguous
    for (int64_t t0 = 0; t0 < total; t0 += S) {
      const float* kh = key(hk, t0);
      for (int64_t t = t0; t < std::min(total, t0 + S); ++t) {
        scores[t] = dot(qh, kh + (t - t0) * D, D) * scale;
        top = std::max(top, scores[t]);
      }
    }
    float sum = 0.f;
    for (int64_t t = 0; t < total; ++t) {
      scores[t] = std::exp(scores[t] - top);
      sum += scores[t];
    }
    float* oh = op + hq * D;
    std::fill(oh, oh + D, 0.f);
    const float inv = 1.f / sum;
    for (int64_t t0 = 0; t0 < total; t0 += S) {
      const float* vh = value(hk, t0);
      for (int64_t t = t0; t < std::min(total, t0 + S); ++t) {
        const float w = scores[t] * inv;
        const float* vt = vh + (t - t0) * D;
        for (int64_t i = 0; i < D; ++i) oh[i] += w * vt[i];
      }
    }
  }
};

}  // namespace

void attend_lone(const float* qp, const float* kp, const float* vp, float* base, int64_t Hq,
                 int64_t Hkv, int64_t P, int64_t S, int64_t D, const int64_t* pages, int64_t past,
                 float* op) {
  const Table table{base, Hkv, P, S, D, pages};
  table.store(kp, vp, past);
  const int64_t total = past + 1, group = Hq / Hkv;
  // split the heads across threads only when each gets real work
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(total * D, 1));
  at::parallel_for(0, Hq, grain, [&](int64_t h0, int64_t h1) {
    std::vector<float> scores(total);
    for (int64_t hq = h0; hq < h1; ++hq) table.attend_head(qp, hq, group, total, scores.data(), op);
  });
}

namespace {

// q [1, Hq, D]; k, v [1, Hkv, D]; pool [2, Hkv, pages, page_size, D] float32 (one layer's, in
// place); `pages` the sequence's page table (its first past / page_size + 1 pages at least),
// `past` tokens before the new one.
at::Tensor decode_attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         at::Tensor& pool, at::IntArrayRef pages, int64_t past) {
  TORCH_CHECK(pool.dim() == 5 && pool.size(0) == 2 && pool.scalar_type() == at::kFloat &&
                  pool.is_contiguous(),
              "pool: one layer's contiguous float32 [2, kv_heads, pages, page_size, head_dim]");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && q.size(0) == 1 && k.size(0) == 1 &&
                  v.size(0) == 1,
              "q, k, v: one token each, [1, heads, head_dim]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                  v.scalar_type() == at::kFloat,
              "q, k, v: float32");
  const int64_t Hq = q.size(1), Hkv = k.size(1), D = q.size(2);
  const int64_t P = pool.size(2), S = pool.size(3);
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0 && v.size(1) == Hkv && pool.size(1) == Hkv &&
                  k.size(2) == D && v.size(2) == D && pool.size(4) == D,
              "q, k, v and the pool disagree on heads or head_dim");
  check_table(pages, P, S, past);
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  at::Tensor out = at::empty({1, Hq, D}, q.options());
  attend_lone(qc.data_ptr<float>(), kc.data_ptr<float>(), vc.data_ptr<float>(),
              pool.data_ptr<float>(), Hq, Hkv, P, S, D, pages.data(), past, out.data_ptr<float>());
  return out;
}

// A decode step of B sequences, one new token each: q [B, Hq, D]; k, v [B, Hkv, D]; pool one
// layer's, as above; `pages` the rows' tables one after another (row b's at [starts[b],
// starts[b + 1])); pasts[b] row b's tokens before its new one. Every row's K/V is stored, then
// every (row, query head) attends, split across threads: the eager path's writes, gathers,
// padding masks and SDPA calls cost more than this work at a decode step's contexts. Row b's
// output is bit for bit decode_attend's on row b alone (the same head loop).
at::Tensor decode_attend_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              at::Tensor& pool, at::IntArrayRef pages, at::IntArrayRef starts,
                              at::IntArrayRef pasts) {
  TORCH_CHECK(pool.dim() == 5 && pool.size(0) == 2 && pool.scalar_type() == at::kFloat &&
                  pool.is_contiguous(),
              "pool: one layer's contiguous float32 [2, kv_heads, pages, page_size, head_dim]");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q, k, v: [rows, heads, head_dim]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                  v.scalar_type() == at::kFloat,
              "q, k, v: float32");
  const int64_t B = q.size(0), Hq = q.size(1), Hkv = k.size(1), D = q.size(2);
  const int64_t P = pool.size(2), S = pool.size(3);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && static_cast<int64_t>(pasts.size()) == B &&
                  static_cast<int64_t>(starts.size()) == B + 1,
              "q, k, v, pasts and starts disagree on the rows (starts: one more than rows)");
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0 && v.size(1) == Hkv && pool.size(1) == Hkv &&
                  k.size(2) == D && v.size(2) == D && pool.size(4) == D,
              "q, k, v and the pool disagree on heads or head_dim");
  TORCH_CHECK(starts[0] == 0 && starts[B] == static_cast<int64_t>(pages.size()),
              "starts: from 0 to the tables' length");
  // every table checked, and no two rows writing one slot, before anything is written
  std::vector<int64_t> slots(B);
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(starts[b] <= starts[b + 1], "starts: not in order at row ", b);
    const at::IntArrayRef table = pages.slice(starts[b], starts[b + 1] - starts[b]);
    check_table(table, P, S, pasts[b]);
    slots[b] = table[pasts[b] / S] * S + pasts[b] % S;
    longest = std::max(longest, pasts[b] + 1);
  }
  std::vector<int64_t> sorted(slots);
  std::sort(sorted.begin(), sorted.end());
  TORCH_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
              "two rows write the same slot of the pool");
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  at::Tensor out = at::empty({B, Hq, D}, q.options());
  const float *qp = qc.data_ptr<float>(), *kp = kc.data_ptr<float>(), *vp = vc.data_ptr<float>();
  float* base = pool.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    const Table table{base, Hkv, P, S, D, pages.data() + starts[b]};
    table.store(kp + b * Hkv * D, vp + b * Hkv * D, pasts[b]);
  }
  const int64_t group = Hq / Hkv;
  const int64_t work = std::max<int64_t>(longest * D, 1);  // a (row, head)'s, at most
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / work);
  at::parallel_for(0, B * Hq, grain, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(longest);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / Hq;
      const Table table{base, Hkv, P, S, D, pages.data() + starts[b]};
      table.attend_head(qp + b * Hq * D, i % Hq, group, pasts[b] + 1, scores.data(),
                        op + b * Hq * D);
    }
  });
  return out;
}

}  // namespace
}  // namespace fastllm_cpu

TORCH_LIBRARY_FRAGMENT(fastllm_cpu, m) {
  m.def(
      "decode_attend(Tensor q, Tensor k, Tensor v, Tensor(a!) pool, int[] pages, int past) "
      "-> Tensor");
  m.def(
      "decode_attend_rows(Tensor q, Tensor k, Tensor v, Tensor(a!) pool, int[] pages, "
      "int[] starts, int[] pasts) -> Tensor");
}

TORCH_LIBRARY_IMPL(fastllm_cpu, CPU, m) {
  m.impl("decode_attend", &fastllm_cpu::decode_attend);
  m.impl("decode_attend_rows", &fastllm_cpu::decode_attend_rows);
}
