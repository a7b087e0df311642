// Vectorised alpha of one Gaussian along a run of pixels of one row (CPU kernels).
//
// gauss_alpha() (common.h) is the rule; this evaluates it for pixels p0 .. p0+n-1 of the row
// whose centre is fy, in one SIMD loop, with exp() replaced by a polynomial that the compiler
// vectorises (max relative error 2e-7 on [-kSigmaSkip, 0]; CUDA uses __expf, the torch
// reference torch.exp). alpha[i] = 0 marks a skipped pair (a kept one has alpha >= 1/255).
#pragma once

#include <cstdint>
#include <algorithm>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "../common.h"
#include "fastmath.h"
#include "vec16.h"

namespace rh3dgs {

constexpr int64_t kRowBlock = 16;

// Size of the alpha / vis buffers row_alphas() needs for runs of up to n pixels.
inline int64_t row_alpha_capacity(int64_t n) { return (n + kRowBlock - 1) / kRowBlock * kRowBlock; }

namespace detail {
// alpha and vis of one native vector of lanes base .. base + kNativeLanes - 1 (see row_alphas).
// std::min(a, b) is (b < a ? b : a) and std::max(a, b) is (a < b ? b : a): the selects below are
// those, lane by lane, so the result is that of the scalar rule (gauss_alpha with exp_neg).
inline void alpha_block(float x0, float a, float cy, float by, float o, int64_t base, float* __restrict alpha,
                        float* __restrict vis) {
  vfn iota;
  for (int l = 0; l < kNativeLanes; ++l) iota[l] = (float)l;
  const vfn zero = splatn(0.0f), skip = splatn(kSigmaSkip);
  const vfn dx = x0 - (iota + (float)base);
  const vfn sigma = 0.5f * a * dx * dx + cy + by * dx;
  const vfn s0 = sigma < zero ? zero : sigma;
  const vfn v = exp_neg_v(-(skip < s0 ? skip : s0));
  const vfn ov = o * v;
  vfn al = kAlphaMax < ov ? splatn(kAlphaMax) : ov;
  al = al >= kAlphaMin ? al : zero;
  al = sigma >= zero ? al : zero;
  al = sigma <= skip ? al : zero;
  storen(vis + base, v);
  storen(alpha + base, al);
}
}  // namespace detail

// Gaussian (mean mx, my; conic a, b, c; opacity o) at pixel centres (p0 + i + 0.5, fy), i < n:
// alpha[i] (0 where gauss_alpha() skips the pair) and vis[i] = exp(-sigma). Whole native vectors
// (one AVX-512 register or one AVX2 register per 16 / 8 lanes, no scalar tail); the caller's
// buffers hold row_alpha_capacity(n) floats, lanes >= n are ignored.
inline void row_alphas(float mx, float my, float a, float b, float c, float o, float fy, int64_t p0, int64_t n,
                       float* __restrict alpha, float* __restrict vis) {
  static_assert(kRowBlock % kNativeLanes == 0, "whole native vectors per block");
  const float dy = my - fy;
  const float cy = 0.5f * c * dy * dy, by = b * dy;
  const float x0 = mx - ((float)p0 + 0.5f);
  for (int64_t base = 0; base < n; base += kNativeLanes) detail::alpha_block(x0, a, cy, by, o, base, alpha, vis);
}

// row_alphas() where only lanes lo .. hi (<= hi < L) can have alpha > 0 (TileRows' per-row span):
// the native vectors overlapping the span are evaluated (same bits as row_alphas), the other
// vectors of the L lanes get alpha 0 (vis is left unset there). Most footprints on a row fit in
// one 8-lane vector.
inline void row_alphas_span(float mx, float my, float a, float b, float c, float o, float fy, int64_t p0, int64_t L,
                            int lo, int hi, float* __restrict alpha, float* __restrict vis) {
  const float dy = my - fy;
  const float cy = 0.5f * c * dy * dy, by = b * dy;
  const float x0 = mx - ((float)p0 + 0.5f);
  const int64_t first = lo / kNativeLanes * kNativeLanes, last = hi / kNativeLanes * kNativeLanes;
  for (int64_t base = 0; base < L; base += kNativeLanes) {
    if (base < first || base > last) storen(alpha + base, splatn(0.0f));
    else detail::alpha_block(x0, a, cy, by, o, base, alpha, vis);
  }
}

// Bit l set for the lanes l < L (L <= 64, a multiple of kRowBlock) with alpha[l] > 0 and
// k <= limit[l]: the pixels a Gaussian (index k in depth order) composites onto (AVX-512: one
// compare pair per block; AVX2: two). Iterating the
// set bits replaces a branch per pixel, which mispredicts on footprint edges.
inline uint64_t lane_mask(const float* alpha, const int32_t* limit, int32_t k, int64_t L) {
  uint64_t mask = 0;
  for (int64_t base = 0; base < L; base += kRowBlock) {
#if defined(__AVX512F__)
    static_assert(kRowBlock == 16, "one AVX-512 register per block");
    const __mmask16 pos = _mm512_cmp_ps_mask(_mm512_loadu_ps(alpha + base), _mm512_setzero_ps(), _CMP_GT_OQ);
    const __mmask16 in = _mm512_cmp_epi32_mask(_mm512_set1_epi32(k), _mm512_loadu_si512(limit + base), _MM_CMPINT_LE);
    mask |= (uint64_t)(pos & in) << base;
#elif defined(__AVX2__)
    // two 8-lane compares per block; alpha > 0 and not (k > limit), one movemask each
    uint64_t m = 0;
    for (int h = 0; h < 2; ++h) {
      const __m256 pos = _mm256_cmp_ps(_mm256_loadu_ps(alpha + base + 8 * h), _mm256_setzero_ps(), _CMP_GT_OQ);
      const __m256i after = _mm256_cmpgt_epi32(_mm256_set1_epi32(k),
                                               _mm256_loadu_si256((const __m256i*)(limit + base + 8 * h)));
      m |= (uint64_t)(uint32_t)_mm256_movemask_ps(_mm256_andnot_ps(_mm256_castsi256_ps(after), pos)) << (8 * h);
    }
    mask |= m << base;
#else
    uint64_t m = 0;
    for (int64_t l = 0; l < kRowBlock; ++l) m |= (uint64_t)(alpha[base + l] > 0.0f && k <= limit[base + l]) << l;
    mask |= m << base;
#endif
  }
  return mask;
}

}  // namespace rh3dgs
