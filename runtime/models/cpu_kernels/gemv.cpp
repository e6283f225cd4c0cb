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

#include "kernels.h"
#include "vec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>


namespace fastllm_cpu {
namespace {

// How far ahead of the loads the weight streams are prefetched. Measured on the 2-core AVX2 EPYC,
// the 30 layers' int4 projections of SmolLM2-135M and its int8 head [49152, 576] from memory,
// interleaved, best of 12: no prefetch 11.0 / 5.3 ms at 1 thread; 2 KiB ahead 9.3 / 2.6 ms
// (4 KiB about the same). The hardware prefetchers alone stop well short of a core's bandwidth.
constexpr int64_t kPrefetch = 2048;

inline void prefetch(const void* p, int64_t ahead) {
  _mm_prefetch(static_cast<const char*>(p) + ahead, _MM_HINT_T0);
}

// x [M, K] float -> xq [M, K] int8, dx / sx [M, K / 32]: the blocks' scales and sums. A block is
// four vectors of 8; the rounding is the CPU's to nearest even (as nearbyint's).
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* xq, float* dx, float* sx) {
  const int64_t nb = K / kBlock;
  const __m256 sign = _mm256_set1_ps(-0.f);
  // the packs interleave the two 128-bit lanes: this puts the 32 bytes back in order
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* p = x + m * K + b * kBlock;
      const __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8);
      const __m256 v2 = _mm256_loadu_ps(p + 16), v3 = _mm256_loadu_ps(p + 24);
      const __m256 a01 = _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1));
      const __m256 a23 = _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3));
      const float d = hmax(_mm256_max_ps(a01, a23)) / 127.f;
      const __m256 inv = _mm256_set1_ps(d > 0.f ? 1.f / d : 0.f);
      const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, inv));
      const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, inv));
      const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, inv));
      const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, inv));
      const __m256i bytes =
          _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + m * K + b * kBlock),
                          _mm256_permutevar8x32_epi32(bytes, order));
      dx[m * nb + b] = d;
      sx[m * nb + b] = hsum(_mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3)));
    }
  }
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

// x's int8 blocks, scales and sums (quantize_rows), in buffers of the calling thread kept from
// call to call: a decode step makes ~120 of these calls, and the stack (stack.cpp) makes them
// with no allocation at all
struct QuantizedX {
  const int8_t* xq;
  const float *dx, *sx;
  QuantizedX(const float* x, int64_t M, int64_t K) {
    thread_local std::vector<int8_t> q;
    thread_local std::vector<float> d, s;
    const int64_t nb = K / kBlock;
    q.resize(M * K);
    d.resize(M * nb);
    s.resize(M * nb);
    quantize_rows(x, M, K, q.data(), d.data(), s.data());
    xq = q.data();
    dx = d.data();
    sx = s.data();
  }
};

inline void store(float* o, float v, bool accumulate) { *o = accumulate ? *o + v : v; }

// an int4 tile's four outputs: each row's 8 lanes summed, plus its centring and zeros (`extra`)
inline void store_tile(float* o, __m256 a0, __m256 a1, __m256 a2, __m256 a3, const float* e,
                       bool accumulate) {
  store(o, hsum(a0) + e[0], accumulate);
  store(o + 1, hsum(a1) + e[1], accumulate);
  store(o + 2, hsum(a2) + e[2], accumulate);
  store(o + 3, hsum(a3) + e[3], accumulate);
}

// Rows of activations per pass over a thread's tiles in the many-row GEMMs: a chunk's int8 codes
// (64 x K bytes, 96 KiB at K = 1536) stay in L2 while each tile's weights sit in L1 and serve
// every row of the chunk; a longer prompt re-reads the weights once a chunk.
constexpr int64_t kRowChunk = 64;

// int4_rows for M > 1 (a prefill, a batched step): the loops turned round. Each tile's four rows
// of codes are unpacked once into 32-byte vectors (nb x 128 bytes: L1) and its scales and zeros
// converted once, then every row of x in the chunk is multiplied by them, where the one-row
// order would stream the whole weight from memory once a row. A row's arithmetic is the
// one-row path's in the same order, so its result is bit for bit the same.
// The per-(row, block) setup (the block scales times x's, the zeros' and centring's sums) is done
// for eight rows of x at once, one row a lane: x's block values are transposed to [block][row]
// first, so each lane does the one-row path's multiply-adds in its order. Done a row at a time,
// it was a quarter of the kernel's instructions and a serial chain of 2 nb multiply-adds a row
// and tile; eight rows a vector made 32 and 64 rows 1.33-1.43x as fast on the 2-core EPYC. The
// products then take two rows of x at a time (eight independent sums where four left the FMA
// latency exposed): 1.11-1.16x more at 1 thread.
void int4_many(const int8_t* q, const float* dxp, const float* sxp, const float* cp, int64_t M,
               int64_t K, const uint8_t* w, const uint16_t* d, const uint16_t* z, int64_t N,
               float* out, bool accumulate) {
  const int64_t nb = K / kBlock;
  const int64_t Mp = (M + 7) / 8 * 8;  // rows padded to whole vectors (the pad's lanes unused)
  // [block][row]; the workers get pointers (a thread_local named in the lambda would be theirs)
  thread_local std::vector<float> dxt, sxt, ct;
  dxt.assign(nb * Mp, 0.f);
  sxt.assign(nb * Mp, 0.f);
  ct.assign(nb * Mp, 0.f);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < nb; ++b) {
      dxt[b * Mp + m] = dxp[m * nb + b];
      sxt[b * Mp + m] = sxp[m * nb + b];
      ct[b * Mp + m] = cp[m * nb + b];
    }
  }
  const float *dxT = dxt.data(), *sxT = sxt.data(), *cT = ct.data();
  at::parallel_for(0, N / 4, 1, [&](int64_t t0, int64_t t1) {
    std::vector<__m256i> wu(nb * 4);
    std::vector<float> d4s(nb * 4), z4s(nb * 4);
    // eight rows' block scales times x's: [block][tile row][row of x]
    std::vector<float> sc(nb * 32);
    for (int64_t m0 = 0; m0 < M; m0 += kRowChunk) {
      const int64_t m1 = std::min(M, m0 + kRowChunk);
      for (int64_t t = t0; t < t1; ++t) {
        const uint8_t* wt = w + t * nb * 64;
        const uint16_t *dt = d + t * nb * 4, *zt = z + t * nb * 4;
        for (int64_t b = 0; b < nb; ++b) {
          prefetch(wt + b * 64, kPrefetch);
          for (int64_t r = 0; r < 4; ++r) wu[b * 4 + r] = unpack_nibbles(wt + b * 64 + r * 16);
          _mm_storeu_ps(d4s.data() + b * 4, load_4_halves(dt + b * 4));
          _mm_storeu_ps(z4s.data() + b * 4, load_4_halves(zt + b * 4));
        }
        for (int64_t v = m0; v < m1; v += 8) {
          // eight rows' setup, then their products
          __m256 e0 = _mm256_setzero_ps(), e1 = e0, e2 = e0, e3 = e0;
          for (int64_t b = 0; b < nb; ++b) {
            const int64_t at = b * Mp + v;
            const __m256 dx = _mm256_loadu_ps(dxT + at);
            const __m256 sx = _mm256_loadu_ps(sxT + at);
            const __m256 c = _mm256_loadu_ps(cT + at);
            const float *d4 = d4s.data() + b * 4, *z4 = z4s.data() + b * 4;
            float* s = sc.data() + b * 32;
            auto row = [&](int64_t r, __m256 e) {
              const __m256 dr = _mm256_set1_ps(d4[r]);
              _mm256_storeu_ps(s + r * 8, _mm256_mul_ps(dr, dx));
              e = _mm256_fmadd_ps(_mm256_set1_ps(z4[r]), sx, e);
              return _mm256_fnmadd_ps(dr, c, e);
            };
            e0 = row(0, e0);
            e1 = row(1, e1);
            e2 = row(2, e2);
            e3 = row(3, e3);
          }
          float ext[4][8];
          _mm256_storeu_ps(ext[0], e0);
          _mm256_storeu_ps(ext[1], e1);
          _mm256_storeu_ps(ext[2], e2);
          _mm256_storeu_ps(ext[3], e3);
          // two rows of x at a time: each tile row's codes serve both, eight chains of adds
          const int64_t end = std::min(m1, v + 8);
          int64_t m = v;
          for (; m + 2 <= end; m += 2) {
            const int8_t* x0 = q + m * K;
            const int8_t* x1 = x0 + K;
            const int64_t i = m - v;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            __m256 c0 = a0, c1 = a0, c2 = a0, c3 = a0;
            for (int64_t b = 0; b < nb; ++b) {
              const __m256i xv0 =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0 + b * kBlock));
              const __m256i xv1 =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x1 + b * kBlock));
              const __m256i* wb = wu.data() + b * 4;
              const float* s = sc.data() + b * 32 + i;
              a0 = fma_dot(wb[0], xv0, s[0], a0);
              c0 = fma_dot(wb[0], xv1, s[1], c0);
              a1 = fma_dot(wb[1], xv0, s[8], a1);
              c1 = fma_dot(wb[1], xv1, s[9], c1);
              a2 = fma_dot(wb[2], xv0, s[16], a2);
              c2 = fma_dot(wb[2], xv1, s[17], c2);
              a3 = fma_dot(wb[3], xv0, s[24], a3);
              c3 = fma_dot(wb[3], xv1, s[25], c3);
            }
            const float e0[4] = {ext[0][i], ext[1][i], ext[2][i], ext[3][i]};
            const float e1[4] = {ext[0][i + 1], ext[1][i + 1], ext[2][i + 1], ext[3][i + 1]};
            store_tile(out + m * N + t * 4, a0, a1, a2, a3, e0, accumulate);
            store_tile(out + (m + 1) * N + t * 4, c0, c1, c2, c3, e1, accumulate);
          }
          if (m < end) {  // an odd row left
            const int8_t* xm = q + m * K;
            const int64_t i = m - v;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t b = 0; b < nb; ++b) {
              const __m256i xv =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xm + b * kBlock));
              const __m256i* wb = wu.data() + b * 4;
              const float* s = sc.data() + b * 32 + i;
              a0 = fma_dot(wb[0], xv, s[0], a0);
              a1 = fma_dot(wb[1], xv, s[8], a1);
              a2 = fma_dot(wb[2], xv, s[16], a2);
              a3 = fma_dot(wb[3], xv, s[24], a3);
            }
            const float e[4] = {ext[0][i], ext[1][i], ext[2][i], ext[3][i]};
            store_tile(out + m * N + t * 4, a0, a1, a2, a3, e, accumulate);
          }
        }
      }
    }
  });
}

}  // namespace

// int4, weights in tiles of four rows: codes [N, K / 2] uint8 stored tile by tile, block by
// block, row by row (tile t, block b, row r: 16 bytes at ((t * nb + b) * 4 + r) * 16), so a tile
// is one sequential stream (four short row streams measured slower: the prefetchers lost them);
// scales and zeros [N, K / 32] float16 in the same order (w = scale * (q - 8) + zero, a block's
// own). Four rows share each block of x; the (q - 8) centring and the zeros come from per-block
// sums of x:  sum_i w_i x_i ~= scale dx sum_i q_i xq_i - 8 scale dx sum_i xq_i + zero sum_i x_i
void int4_rows(const float* x, int64_t M, int64_t K, const uint8_t* w, const uint16_t* d,
               const uint16_t* z, int64_t N, float* out, bool accumulate) {
  const int64_t nb = K / kBlock;
  const QuantizedX qx(x, M, K);
  // per block of x: 8 dx sum(xq), the centring's share (maddubs by ones: the 32 codes' sum)
  thread_local std::vector<float> centre;
  centre.resize(M * nb);
  const __m256i ones = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < M * nb; ++i) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx.xq + i * kBlock));
    const float s = hsum(dot32(ones, v));
    centre[i] = 8.f * qx.dx[i] * s;
  }
  const int8_t* q = qx.xq;
  const float *dxp = qx.dx, *sxp = qx.sx, *cp = centre.data();
  if (M > 1) {
    int4_many(q, dxp, sxp, cp, M, K, w, d, z, N, out, accumulate);
    return;
  }
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
          // scales and zeros: 8 bytes a block where the codes take 64
          prefetch(dt + b * 4, kPrefetch / 8);
          prefetch(zt + b * 4, kPrefetch / 8);
          const __m128 d4 = load_4_halves(dt + b * 4), z4 = load_4_halves(zt + b * 4);
          _mm_storeu_ps(sc.data() + b * 4, _mm_mul_ps(d4, _mm_set1_ps(dxm[b])));
          extra = _mm_fmadd_ps(z4, _mm_set1_ps(sxm[b]), extra);
          extra = _mm_fnmadd_ps(d4, _mm_set1_ps(cm[b]), extra);
        }
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t b = 0; b < nb; ++b) {
          prefetch(wt + b * 64, kPrefetch);
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
        store_tile(out + m * N + t * 4, a0, a1, a2, a3, e, accumulate);
      }
    }
  });
}

// int8: codes [N, K] int8, one float scale a row. maddubs needs one unsigned operand, so the
// codes' magnitudes go unsigned and their signs move onto x (_mm256_sign_epi8).
void int8_rows(const float* x, int64_t M, int64_t K, const int8_t* w, const float* s, int64_t N,
               float* out, bool accumulate) {
  const int64_t nb = K / kBlock;
  const QuantizedX qx(x, M, K);
  const int8_t* q = qx.xq;
  const float* dxp = qx.dx;
  auto dot = [&](const int8_t* wr, const __m256i xv, float scale, __m256 acc) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr));
    return fma_dot(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv), scale, acc);
  };
  // a tile's four rows (4 K bytes) stay in L1 for every row of a chunk of x (kRowChunk)
  at::parallel_for(0, (N + 3) / 4, M > 1 ? 1 : 16, [&](int64_t t0, int64_t t1) {
    for (int64_t m0 = 0; m0 < M; m0 += kRowChunk) {
      const int64_t m1 = std::min(M, m0 + kRowChunk);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t n0 = t * 4, rows = std::min<int64_t>(4, N - n0);
        for (int64_t m = m0; m < m1; ++m) {
          const int8_t* xm = q + m * K;
          const float* dxm = dxp + m * nb;
          if (rows == 4) {
            const int8_t* w0 = w + n0 * K;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t b = 0; b < nb; ++b) {
              // the tile's four rows are one run of 4 K bytes, read 128 a block
              prefetch(w0 + b * 128, kPrefetch);
              prefetch(w0 + b * 128, kPrefetch + 64);
              const __m256i xv =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xm + b * kBlock));
              const int64_t o = b * kBlock;
              a0 = dot(w0 + o, xv, dxm[b], a0);
              a1 = dot(w0 + K + o, xv, dxm[b], a1);
              a2 = dot(w0 + 2 * K + o, xv, dxm[b], a2);
              a3 = dot(w0 + 3 * K + o, xv, dxm[b], a3);
            }
            float* o = out + m * N + n0;
            store(o, hsum(a0) * s[n0], accumulate);
            store(o + 1, hsum(a1) * s[n0 + 1], accumulate);
            store(o + 2, hsum(a2) * s[n0 + 2], accumulate);
            store(o + 3, hsum(a3) * s[n0 + 3], accumulate);
          } else {
            for (int64_t n = n0; n < n0 + rows; ++n) {
              __m256 a = _mm256_setzero_ps();
              for (int64_t b = 0; b < nb; ++b) {
                const __m256i xv =
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xm + b * kBlock));
                a = dot(w + n * K + b * kBlock, xv, dxm[b], a);
              }
              store(out + m * N + n, hsum(a) * s[n], accumulate);
            }
          }
        }
      }
    }
  });
}

void check_int4(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kByte && codes.is_contiguous() &&
                  codes.size(0) % 4 == 0,
              "int4 codes: uint8 [N, K/2], contiguous, N a multiple of 4");
  const int64_t N = codes.size(0), K = codes.size(1) * 2;
  TORCH_CHECK(K % kBlock == 0, "int4 codes: K must divide by 32");
  const int64_t nb = K / kBlock;
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() &&
                  scales.numel() == N * nb && zeros.scalar_type() == at::kHalf &&
                  zeros.is_contiguous() && zeros.numel() == N * nb,
              "int4 scales and zeros: contiguous float16 [N, K / 32]");
}

void check_int8(const at::Tensor& codes, const at::Tensor& scales) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kChar && codes.is_contiguous() &&
                  codes.size(1) % kBlock == 0,
              "int8 codes: int8 [N, K], contiguous, K a multiple of 32");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() &&
                  scales.numel() == codes.size(0),
              "int8 scales: contiguous float32 [N]");
}

const uint16_t* halves(const at::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<at::Half>());
}

namespace {

at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                   const at::Tensor& zeros) {
  check_int4(codes, scales, zeros);
  const int64_t N = codes.size(0), K = codes.size(1) * 2, M = x.size(0);
  check_x(x, K);
  at::Tensor y = at::empty({M, N}, x.options());
  int4_rows(x.data_ptr<float>(), M, K, codes.data_ptr<uint8_t>(), halves(scales), halves(zeros), N,
            y.data_ptr<float>(), false);
  return y;
}

at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales) {
  check_int8(codes, scales);
  const int64_t N = codes.size(0), K = codes.size(1), M = x.size(0);
  check_x(x, K);
  at::Tensor y = at::empty({M, N}, x.options());
  int8_rows(x.data_ptr<float>(), M, K, codes.data_ptr<int8_t>(), scales.data_ptr<float>(), N,
            y.data_ptr<float>(), false);
  return y;
}

}  // namespace
}  // namespace fastllm_cpu

TORCH_LIBRARY(fastllm_cpu, m) {
  m.def("int4_mm(Tensor x, Tensor codes, Tensor scales, Tensor zeros) -> Tensor");
  m.def("int8_mm(Tensor x, Tensor codes, Tensor scales) -> Tensor");
}

TORCH_LIBRARY_IMPL(fastllm_cpu, CPU, m) {
  m.impl("int4_mm", &fastllm_cpu::int4_mm);
  m.impl("int8_mm", &fastllm_cpu::int8_mm);
}
