// Shared helpers for the rh3dgs rasterization core (CPU and CUDA).
//
// Conventions (identical to gsplat's rasterize_to_pixels):
//   pixel centre (x + 0.5, y + 0.5); delta = mean2d - pixel;
//   sigma = 0.5 * (a dx^2 + c dy^2) + b dx dy with conic = (a, b, c);
//   alpha = min(0.999, opacity * exp(-sigma)); skipped if sigma < 0 or alpha < 1/255;
//   a pixel stops before the Gaussian that would bring transmittance T to <= 1e-4.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define RH_HD __host__ __device__ __forceinline__
#else
#define RH_HD inline
#endif

namespace rh3dgs {

constexpr float kAlphaMin = 1.0f / 255.0f;
constexpr float kAlphaMax = 0.999f;
constexpr float kTransmittanceMin = 1e-4f;
// opacity <= 1, so sigma > kSigmaSkip implies alpha <= exp(-5.55) < 1/255: skip without exp().
// (A margin above log(255) = 5.5413 keeps the decision identical to the alpha test.)
constexpr float kSigmaSkip = 5.55f;

// Returns sigma of a Gaussian at a pixel (sigma < 0 or sigma > kSigmaSkip means "skip").
RH_HD float gauss_sigma(float a, float b, float c, float dx, float dy) {
  return 0.5f * (a * dx * dx + c * dy * dy) + b * dx * dy;
}

// Run [start, end) of the flat tile ``flat`` (camera-major) in flatten_ids, from isect_offsets
// (n_tiles_total = B * TH * TW tiles, n_isects intersections in all).
RH_HD void tile_bounds(const int32_t* offsets, int64_t flat, int64_t n_tiles_total, int64_t n_isects, int64_t& start,
                       int64_t& end) {
  start = offsets[flat];
  end = (flat == n_tiles_total - 1) ? n_isects : offsets[flat + 1];
}

// Alpha of a Gaussian (conic a, b, c; opacity o) at offset (dx, dy) = mean2d - pixel.
// Returns false when the pair is skipped (sigma < 0 or alpha < 1/255); otherwise sets
// vis = exp(-sigma) and alpha = min(0.999, o * vis). The one place these rules live.
RH_HD bool gauss_alpha(float a, float b, float c, float o, float dx, float dy, float& alpha, float& vis) {
  const float sigma = gauss_sigma(a, b, c, dx, dy);
  if (sigma < 0.0f || sigma > kSigmaSkip) return false;
  vis = expf(-sigma);  // __expf under nvcc --use_fast_math
  alpha = o * vis < kAlphaMax ? o * vis : kAlphaMax;
  return alpha >= kAlphaMin;
}

}  // namespace rh3dgs
