// A lone token's pass through a whole llama-family decoder stack, in one call (the module doc of
// runtime/models/cpu_kernels says when it runs; stack.py packs the weights). Why: on an AVX2 CPU
// each torch op costs 3-10 us and the eager step runs ~8 of them a layer between its GEMMs
// (norms, rotary, SiLU * mul, residual adds, casts) plus the Python around them: ~15 ms of a
// ~30 ms token on SmolLM2-135M, against ~17 ms of GEMMs. Here the same layer, written out:
//
//   h = rms_norm(x) * w_in;  q, k, v = h Wqkv^T;  q, k rotated (half-split, HF's layout)
//   a = attention(q, k, v) over the sequence's pages (its K/V stored first)
//   x += a Wo^T;  h = rms_norm(x) * w_post;  g, u = h Wgu^T;  x += (silu(g) u) Wdown^T
//
// in fp32, every projection an int4 or int8 kernel of gemv.cpp (the residual adds done by their
// stores), the attention attend.cpp's. No tensor is made between them.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "kernels.h"
#include "vec.h"

namespace fastllm_cpu {
namespace {

// One projection's weights: 3 tensors (int4: codes, scales, zeros) or 2 (int8: codes, scales)
struct Projection {
  const at::Tensor* t;
  int64_t count, N, K;

  void check(int64_t n, int64_t k, const char* name) {
    if (count == 3) {
      check_int4(t[0], t[1], t[2]);
    } else {
      TORCH_CHECK(count == 2, name, ": a projection is 3 tensors (int4) or 2 (int8)");
      check_int8(t[0], t[1]);
    }
    const int64_t rows = t[0].size(0), cols = count == 3 ? t[0].size(1) * 2 : t[0].size(1);
    TORCH_CHECK(rows == n && cols == k, name, ": expected [", n, ", ", k, "], got [", rows, ", ",
                cols, "]");
    N = n;
    K = k;
  }

  void apply(const float* x, float* y, bool accumulate) const {
    if (count == 3) {
      int4_rows(x, 1, K, t[0].data_ptr<uint8_t>(), halves(t[1]), halves(t[2]), N, y, accumulate);
    } else {
      int8_rows(x, 1, K, t[0].data_ptr<int8_t>(), t[1].data_ptr<float>(), N, y, accumulate);
    }
  }
};

// ops.rms_norm's fp32 formula: w * (x * rsqrt(mean(x^2) + eps))
void rms_norm(const float* x, const float* w, int64_t H, double eps, float* out) {
  const float squares = dot(x, x, H);
  const float r = 1.f / std::sqrt(squares / static_cast<float>(H) + static_cast<float>(eps));
  for (int64_t i = 0; i < H; ++i) out[i] = w[i] * (x[i] * r);
}

// ops.rotary: x * cos + swap_halves(x) * sin, sin carrying rotate_half's sign (RopeTable's rows)
void rotate(float* x, int64_t heads, int64_t D, const float* cos, const float* sin) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * D;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos[i] + b * sin[i];
      v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
  }
}

void check_vector(const at::Tensor& t, int64_t n, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == n, name,
              ": a contiguous float32 tensor of ", n, " values");
}

// x [1, H] (in place); weights, layer by layer: input norm, qkv's 2-3 tensors, o's, post norm,
// gate_up's, down's; counts: each layer's four projections' tensor counts; cos, sin [D] the
// token's rotary rows; pool [layers, 2, Hkv, pages, page_size, D]; pages the sequence's page
// table, `past` tokens before this one
void decode_stack(at::Tensor& x, at::TensorList weights, at::IntArrayRef counts,
                  const at::Tensor& cos, const at::Tensor& sin, at::Tensor& pool,
                  at::IntArrayRef pages, int64_t past, int64_t num_heads, int64_t intermediate,
                  double eps) {
  TORCH_CHECK(pool.dim() == 6 && pool.size(1) == 2 && pool.scalar_type() == at::kFloat &&
                  pool.is_contiguous(),
              "pool: contiguous float32 [layers, 2, kv_heads, pages, page_size, head_dim]");
  const int64_t L = pool.size(0), Hkv = pool.size(2), P = pool.size(3), S = pool.size(4);
  const int64_t D = pool.size(5), Hq = num_heads, I = intermediate;
  TORCH_CHECK(x.dim() == 2 && x.size(0) == 1 && x.scalar_type() == at::kFloat &&
                  x.is_contiguous(),
              "x: one token's contiguous float32 [1, hidden]");
  const int64_t H = x.size(1);
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0 && D % 2 == 0 && I > 0, "heads, head_dim or sizes invalid");
  check_table(pages, P, S, past);
  TORCH_CHECK(static_cast<int64_t>(counts.size()) == 4 * L, "counts: four a layer");
  check_vector(cos, D, "cos");
  check_vector(sin, D, "sin");
  // check every layer before running any: a bad pack fails whole, never half a step
  std::vector<Projection> proj(4 * L);
  std::vector<const float*> norms(2 * L);
  const int64_t qkv_n = (Hq + 2 * Hkv) * D;
  const int64_t sizes[4][2] = {{qkv_n, H}, {H, Hq * D}, {2 * I, H}, {H, I}};
  const char* names[4] = {"qkv", "o", "gate_up", "down"};
  size_t at = 0;
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t p = 0; p < 4; ++p) {
      if (p == 0 || p == 2) {
        TORCH_CHECK(at < weights.size(), "weights: fewer tensors than counts say");
        check_vector(weights[at], H, "norm weight");
        norms[2 * l + p / 2] = weights[at].data_ptr<float>();
        ++at;
      }
      Projection& pr = proj[4 * l + p];
      pr.count = counts[4 * l + p];
      TORCH_CHECK(pr.count >= 2 && at + pr.count <= weights.size(),
                  "weights: fewer tensors than counts say");
      pr.t = &weights[at];
      pr.check(sizes[p][0], sizes[p][1], names[p]);
      at += pr.count;
    }
  }
  TORCH_CHECK(at == weights.size(), "weights: more tensors than counts say");
  std::vector<float> h(std::max(H, I)), qkv(qkv_n), attn(Hq * D), gate_up(2 * I);
  float* xp = x.data_ptr<float>();
  float* base = pool.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  for (int64_t l = 0; l < L; ++l) {
    rms_norm(xp, norms[2 * l], H, eps, h.data());
    proj[4 * l].apply(h.data(), qkv.data(), false);
    rotate(qkv.data(), Hq + Hkv, D, cp, sp);  // q and k: adjacent heads
    float* layer_pool = base + l * 2 * Hkv * P * S * D;
    attend_lone(qkv.data(), qkv.data() + Hq * D, qkv.data() + (Hq + Hkv) * D, layer_pool, Hq, Hkv,
                P, S, D, pages.data(), past, attn.data());
    proj[4 * l + 1].apply(attn.data(), xp, true);
    rms_norm(xp, norms[2 * l + 1], H, eps, h.data());
    proj[4 * l + 2].apply(h.data(), gate_up.data(), false);
    silu_mul(gate_up.data(), gate_up.data() + I, I, h.data());
    proj[4 * l + 3].apply(h.data(), xp, true);
  }
}

}  // namespace
}  // namespace fastllm_cpu

TORCH_LIBRARY_FRAGMENT(fastllm_cpu, m) {
  m.def(
      "decode_stack(Tensor(a!) x, Tensor[] weights, int[] counts, Tensor cos, Tensor sin, "
      "Tensor(b!) pool, int[] pages, int past, int num_heads, int intermediate, float eps) "
      "-> ()");
}

TORCH_LIBRARY_IMPL(fastllm_cpu, CPU, m) { m.impl("decode_stack", &fastllm_cpu::decode_stack); }
