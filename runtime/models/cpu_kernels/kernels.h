// The kernels' pointer-level entry points, shared by the ops of gemv.cpp and attend.cpp and by
// the whole decoder stack of one token (stack.cpp), which calls them with no tensor in between.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace fastllm_cpu {

constexpr int64_t kBlock = 32;  // input features per activation scale and per int4 weight scale

// y [M, N] = x [M, K] W^T, or y += x W^T where `accumulate` (the residual add, done by the
// kernel's store). int4: codes in tiles of four rows with float16 scales and zeros (gemv.cpp's
// int4_mm says the layout); int8: codes [N, K] with one float scale a row. K divides by 32.
void int4_rows(const float* x, int64_t M, int64_t K, const uint8_t* codes, const uint16_t* scales,
               const uint16_t* zeros, int64_t N, float* y, bool accumulate);
void int8_rows(const float* x, int64_t M, int64_t K, const int8_t* codes, const float* scales,
               int64_t N, float* y, bool accumulate);

// Shape checks of the two layouts (a clear error, never a read out of bounds), and a float16
// tensor's data as the kernels read it
void check_int4(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros);
void check_int8(const at::Tensor& codes, const at::Tensor& scales);
const uint16_t* halves(const at::Tensor& t);

// One token's attention over its pages (attend.cpp): its K/V stored at `past`, then out [Hq, D]
// = softmax(q k^T / sqrt(D)) v over the `past + 1` positions, position t at page pages[t / S],
// slot t % S. `layer_pool` is one layer's [2, Hkv, P, S, D]; the caller has checked the shapes
// and the table (check_table).
void check_table(at::IntArrayRef pages, int64_t P, int64_t S, int64_t past);
void attend_lone(const float* q, const float* k, const float* v, float* layer_pool, int64_t Hq,
                 int64_t Hkv, int64_t P, int64_t S, int64_t D, const int64_t* pages, int64_t past,
                 float* out);

}  // namespace fastllm_cpu
