// Vectorised alpha of one Gaussian along the pixels of a tile row (CPU kernels).
//
// gauss_alpha() (common.h) is the rule; alpha_kept() evaluates it for the W pixels of a row unit at once, with
// exp() replaced by a polynomial (max relative error 2e-7 on [-kSigmaSkip, 0]; CUDA uses __expf, the torch
// reference torch.exp).
#pragma once

#include <cstdint>

#include "../common.h"
#include "simd.h"

namespace rh3dgs {

// Lanes per pixel-row buffer of the kernels for tiles of up to n pixels a row (whole 16-lane blocks, so that a
// row unit's vector loads and stores stay inside it).
inline int64_t row_alpha_capacity(int64_t n) { return (n + 15) / 16 * 16; }

// The alpha of a Gaussian at lanes px (pixel offsets from the tile's first column x0), with x0g = mx - (x0 + 0.5),
// h = a / 2, cy = c dy^2 / 2, by = b dy (dy = my - the row's centre): alpha = min(0.999, o exp(-sigma)),
// sigma = (h dx + by) dx + cy, dx = x0g - px (gauss_sigma's terms, two multiply-adds), exp by exp_neg_alpha.
// ok = the lanes the rule keeps (0 <= sigma <= kSigmaSkip, alpha >= 1/255) and vis = exp(-sigma); the other
// lanes' values are left undefined (no clamps, no selects: a mask says which lanes count). alpha >= 1/255 is tested
// on o vis (the same set: the clamp at 0.999 is above 1/255). Every CPU kernel's alpha is this function, so the
// forward, its recording, the backward and the aggregation see the same bits.
template <int W>
inline typename Lanes<W>::V alpha_kept(float x0g, float h, float cy, float by, float o, typename Lanes<W>::V px,
                                       typename Lanes<W>::M& ok, typename Lanes<W>::V& vis) {
  using S = Lanes<W>;
  using V = typename S::V;
  const V dx = x0g - px;
  const V sigma = (h * dx + by) * dx + cy;
  vis = exp_neg_alpha(-sigma);
  const V ov = o * vis;
  ok = S::le(V{}, sigma) & S::le(sigma, splat<V>(kSigmaSkip)) & S::le(splat<V>(kAlphaMin), ov);
  return S::min(splat<V>(kAlphaMax), ov);
}

}  // namespace rh3dgs
