// One-row GEMMs of int4 / int8 weights on AVX2 CPUs (runtime/models/cpu_kernels/__init__.py says
// why they exist). Both quantize the activations to int8 in blocks of 32 (one scale a block, the
// block's exact float sum kept beside it), so a block's dot product is integer multiply-adds:
// _mm256_maddubs_epi16 takes 32 unsigned bytes and 32 signed bytes and gives 16 sums of pairs.
//
// int4 weights, per block of 32 input features: 16 bytes, byte i holding feature i in its low
// nibble and feature i + 16 in its high one (so one AND and one shift give the 32 codes in
// order); the layout of the blocks and the arithmetic are at int4_mm.
// int8 weights: one scale a row, codes [N, K] int8; maddubs needs one unsigned operand, so the
// codes' magnitudes go unsigned and their signs move onto the activations (_mm256_sign_epi8).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kBlock = 32;

// x [M, K] float -> xq [M, K] int8, dx / sx [M, K / 32]: the blocks' scales and exact sums
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* xq, float* dx, float* sx) {
  const int64_t nb = K / kBlock;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* p = x + m * K + b * kBlock;
      float amax = 0.f, sum = 0.f;
      for (int64_t i = 0; i < kBlock; ++i) {
        amax = std::max(amax, std::fabs(p[i]));
        sum += p[i];
      }
      const float d = amax / 127.f;
      const float inv = d > 0.f ? 1.f / d : 0.f;
      int8_t* q = xq + m * K + b * kBlock;
      for (int64_t i = 0; i < kBlock; ++i) q[i] = static_cast<int8_t>(std::nearbyint(p[i] * inv));
      dx[m * nb + b] = d;
      sx[m * nb + b] = sum;
    }
  }
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256i unpack_nibbles(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(v, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
  return _mm256_set_m128i(hi, lo);
}

// 8 int32 sums of the 32 products of unsigned `u` and signed `s`
inline __m256 dot32(__m256i u, __m256i s) {
  const __m256i pairs = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

void check_x(const at::Tensor& x, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous float32 [M, K] tensor");
  TORCH_CHECK(x.size(1) == K && K % kBlock == 0, "x's K must match the weight and divide by 32");
}

// scale * (the 32-product dot of unsigned `u` and signed `s`), added to acc
inline __m256 fma_dot(__m256i u, __m256i s, float scale, __m256 acc) {
  return _mm256_fmadd_ps(dot32(u, s), _mm256_set1_ps(scale), acc);
}

inline __m128 load_4_halves(const uint16_t* p) {
  return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

struct QuantizedX {
  at::Tensor xq, dx, sx;
  QuantizedX(const at::Tensor& x, int64_t K) {
    const int64_t M = x.size(0), nb = K / kBlock;
    xq = at::empty({M, K}, x.options().dtype(at::kChar));
    dx = at::empty({M, nb}, x.options());
    sx = at::empty({M, nb}, x.options());
    quantize_rows(x.data_ptr<float>(), M, K, xq.data_ptr<int8_t>(), dx.data_ptr<float>(),
                  sx.data_ptr<float>());
  }
};

// int4, weights in tiles of four rows: codes [N, K / 2] uint8 stored tile by tile, block by
// block, row by row (tile t, block b, row r: 16 bytes at ((t * nb + b) * 4 + r) * 16), so a tile
// is one sequential stream (four short row streams measured slower: the prefetchers lost them);
// scales and zeros [N, K / 32] float16 in the same order (w = scale * (q - 8) + zero, a block's
// own). Four rows share each block of x; the (q - 8) centring and the zeros come from per-block
// sums of x:  sum_i w_i x_i ~= scale dx sum_i q_i xq_i - 8 scale dx sum_i xq_i + zero sum_i x_i
at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                   const at::Tensor& zeros) {
  TORCH_CHECK(codes.dim() == 2, "codes: uint8 [N, K/2]");
  const int64_t N = codes.size(0), K = codes.size(1) * 2, M = x.size(0);
  check_x(x, K);
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && N % 4 == 0,
              "codes: uint8 [N, K/2], N a multiple of 4");
  const int64_t nb = K / kBlock;
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() &&
                  scales.numel() == N * nb && zeros.scalar_type() == at::kHalf &&
                  zeros.is_contiguous() && zeros.numel() == N * nb,
              "scales and zeros: contiguous float16 [N, K / 32]");
  QuantizedX qx(x, K);
  // per block of x: 8 dx sum(xq), the centring's share
  at::Tensor centre = at::empty({M, nb}, x.options());
  {
    const int8_t* q = qx.xq.data_ptr<int8_t>();
    const float* dx = qx.dx.data_ptr<float>();
    float* c = centre.data_ptr<float>();
    for (int64_t i = 0; i < M * nb; ++i) {
      int32_t s = 0;
      for (int64_t j = 0; j < kBlock; ++j) s += q[i * kBlock + j];
      c[i] = 8.f * dx[i] * static_cast<float>(s);
    }
  }
  at::Tensor y = at::empty({M, N}, x.options());
  const uint8_t* w = codes.data_ptr<uint8_t>();
  const uint16_t* d = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  const uint16_t* z = reinterpret_cast<const uint16_t*>(zeros.data_ptr<at::Half>());
  const int8_t* q = qx.xq.data_ptr<int8_t>();
  const float *dxp = qx.dx.data_ptr<float>(), *sxp = qx.sx.data_ptr<float>();
  const float* cp = centre.data_ptr<float>();
  float* out = y.data_ptr<float>();
  at::parallel_for(0, N / 4, 4, [&](int64_t t0, int64_t t1) {
    std::vector<float> sc(nb * 4);  // a tile's block scales times x's: [block][row]
    for (int64_t m = 0; m < M; ++m) {
      const int8_t* xm = q + m * K;
      const float *dxm = dxp + m * nb, *sxm = sxp + m * nb, *cm = cp + m * nb;
      for (int64_t t = t0; t < t1; ++t) {
        const uint8_t* wt = w + t * nb * 64;
        const uint16_t *dt = d + t * nb * 4, *zt = z + t * nb * 4;
        __m128 extra = _mm_setzero_ps();  // the four rows' centring and zeros
        for (int64_t b = 0; b < nb; ++b) {
          const __m128 d4 = load_4_halves(dt + b * 4), z4 = load_4_halves(zt + b * 4);
          _mm_storeu_ps(sc.data() + b * 4, _mm_mul_ps(d4, _mm_set1_ps(dxm[b])));
          extra = _mm_fmadd_ps(z4, _mm_set1_ps(sxm[b]), extra);
          extra = _mm_fnmadd_ps(d4, _mm_set1_ps(cm[b]), extra);
        }
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t b = 0; b < nb; ++b) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xm + b * kBlock));
          const uint8_t* wb = wt + b * 64;
          const float* s = sc.data() + b * 4;
          a0 = fma_dot(unpack_nibbles(wb), xv, s[0], a0);
          a1 = fma_dot(unpack_nibbles(wb + 16), xv, s[1], a1);
          a2 = fma_dot(unpack_nibbles(wb + 32), xv, s[2], a2);
          a3 = fma_dot(unpack_nibbles(wb + 48), xv, s[3], a3);
        }
        float e[4];
        _mm_storeu_ps(e, extra);
        float* o = out + m * N + t * 4;
        o[0] = hsum(a0) + e[0];
        o[1] = hsum(a1) + e[1];
        o[2] = hsum(a2) + e[2];
        o[3] = hsum(a3) + e[3];
      }
    }
  });
  return y;
}

// int8: codes [N, K] int8, one float scale a row. maddubs needs one unsigned operand, so the
// codes' magnitudes go unsigned and their signs move onto x (_mm256_sign_epi8).
at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales) {
  TORCH_CHECK(codes.dim() == 2, "codes: int8 [N, K]");
  const int64_t N = codes.size(0), K = codes.size(1), M = x.size(0);
  check_x(x, K);
  TORCH_CHECK(codes.scalar_type() == at::kChar && codes.is_contiguous(), "codes: int8 [N, K]");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.numel() == N,
              "scales: contiguous float32 [N]");
  const int64_t nb = K / kBlock;
  QuantizedX qx(x, K);
  at::Tensor y = at::empty({M, N}, x.options());
  const int8_t* w = codes.data_ptr<int8_t>();
  const float* s = scales.data_ptr<float>();
  const int8_t* q = qx.xq.data_ptr<int8_t>();
  const float* dxp = qx.dx.data_ptr<float>();
  float* out = y.data_ptr<float>();
  auto dot = [&](const int8_t* wr, const __m256i xv, float scale, __m256 acc) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr));
    return fma_dot(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv), scale, acc);
  };
  at::parallel_for(0, (N + 3) / 4, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t m = 0; m < M; ++m) {
      const int8_t* xm = q + m * K;
      const float* dxm = dxp + m * nb;
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t n0 = t * 4, rows = std::min<int64_t>(4, N - n0);
        if (rows == 4) {
          const int8_t* w0 = w + n0 * K;
          __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
          for (int64_t b = 0; b < nb; ++b) {
            const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xm + b * kBlock));
            const int64_t o = b * kBlock;
            a0 = dot(w0 + o, xv, dxm[b], a0);
            a1 = dot(w0 + K + o, xv, dxm[b], a1);
            a2 = dot(w0 + 2 * K + o, xv, dxm[b], a2);
            a3 = dot(w0 + 3 * K + o, xv, dxm[b], a3);
          }
          out[m * N + n0] = hsum(a0) * s[n0];
          out[m * N + n0 + 1] = hsum(a1) * s[n0 + 1];
          out[m * N + n0 + 2] = hsum(a2) * s[n0 + 2];
          out[m * N + n0 + 3] = hsum(a3) * s[n0 + 3];
        } else {
          for (int64_t n = n0; n < n0 + rows; ++n) {
            __m256 a = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; ++b) {
              const __m256i xv =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xm + b * kBlock));
              a = dot(w + n * K + b * kBlock, xv, dxm[b], a);
            }
            out[m * N + n] = hsum(a) * s[n];
          }
        }
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(fastllm_cpu, m) {
  m.def("int4_mm(Tensor x, Tensor codes, Tensor scales, Tensor zeros) -> Tensor");
  m.def("int8_mm(Tensor x, Tensor codes, Tensor scales) -> Tensor");
}

TORCH_LIBRARY_IMPL(fastllm_cpu, CPU, m) {
  m.impl("int4_mm", &int4_mm);
  m.impl("int8_mm", &int8_mm);
}
