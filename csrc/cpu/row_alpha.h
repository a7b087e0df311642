// Vectorised alpha of one Gaussian along a run of pixels of one row (CPU kernels).
//
// gauss_alpha() (common.h) is the rule; this evaluates it for pixels p0 .. p0+n-1 of the row
// whose centre is fy, in one SIMD loop, with exp() replaced by a polynomial that the compiler
// vectorises (max relative error 2e-7 on [-kSigmaSkip, 0]; CUDA uses __expf, the torch
// reference torch.exp). alpha[i] = 0 marks a skipped pair (a kept one has alpha >= 1/255).
#pragma once

#include <cstdint>
#include <algorithm>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "../common.h"
#include "fastmath.h"

namespace rh3dgs {

constexpr int64_t kRowBlock = 16;

// Size of the alpha / vis buffers row_alphas() needs for runs of up to n pixels.
inline int64_t row_alpha_capacity(int64_t n) { return (n + kRowBlock - 1) / kRowBlock * kRowBlock; }

// Gaussian (mean mx, my; conic a, b, c; opacity o) at pixel centres (p0 + i + 0.5, fy), i < n:
// alpha[i] (0 where gauss_alpha() skips the pair) and vis[i] = exp(-sigma).
inline void row_alphas(float mx, float my, float a, float b, float c, float o, float fy, int64_t p0, int64_t n,
                       float* __restrict alpha, float* __restrict vis) {
  const float dy = my - fy;
  const float cy = 0.5f * c * dy * dy, by = b * dy;
  const float x0 = mx - ((float)p0 + 0.5f);
  // Whole blocks of kRowBlock lanes (fixed trip count: one vector op each, no scalar tail);
  // the caller's buffers hold row_alpha_capacity(n) floats, lanes >= n are ignored.
  for (int64_t base = 0; base < n; base += kRowBlock) {
#pragma omp simd
  for (int64_t l = 0; l < kRowBlock; ++l) {
    const int64_t i = base + l;
    const float dx = x0 - (float)i;
    const float sigma = 0.5f * a * dx * dx + cy + by * dx;
    const float v = exp_neg(-std::min(std::max(sigma, 0.0f), kSigmaSkip));
    float al = std::min(o * v, kAlphaMax);
    al = al >= kAlphaMin ? al : 0.0f;  // one select per rule: a && chain would not vectorise
    al = sigma >= 0.0f ? al : 0.0f;
    al = sigma <= kSigmaSkip ? al : 0.0f;
    vis[i] = v;
    alpha[i] = al;
  }
  }
}

// Bit l set for the lanes l < L (L <= 64, a multiple of kRowBlock) with alpha[l] > 0 and
// k <= limit[l]: the pixels a Gaussian (index k in depth order) composites onto. Iterating the
// set bits replaces a branch per pixel, which mispredicts on footprint edges.
inline uint64_t lane_mask(const float* alpha, const int32_t* limit, int32_t k, int64_t L) {
  uint64_t mask = 0;
  for (int64_t base = 0; base < L; base += kRowBlock) {
#if defined(__AVX512F__)
    static_assert(kRowBlock == 16, "one AVX-512 register per block");
    const __mmask16 pos = _mm512_cmp_ps_mask(_mm512_loadu_ps(alpha + base), _mm512_setzero_ps(), _CMP_GT_OQ);
    const __mmask16 in = _mm512_cmp_epi32_mask(_mm512_set1_epi32(k), _mm512_loadu_si512(limit + base), _MM_CMPINT_LE);
    mask |= (uint64_t)(pos & in) << base;
#else
    uint64_t m = 0;
    for (int64_t l = 0; l < kRowBlock; ++l) m |= (uint64_t)(alpha[base + l] > 0.0f && k <= limit[base + l]) << l;
    mask |= m << base;
#endif
  }
  return mask;
}

}  // namespace rh3dgs
