// Per-row culling inside a tile (CPU kernels): for every pixel row of a tile, the tile's
// Gaussians (in depth order) whose alpha can reach 1/255 on that row, plus each one's
// x-extent. A pair outside the conservative ellipse box has sigma > log(255 o) and would be
// skipped by gauss_alpha() anyway, so results are bit-identical to scanning every Gaussian.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../common.h"

namespace rh3dgs {

struct TileRows {
  std::vector<float> xlo, xhi;       // per Gaussian k of the tile
  std::vector<int32_t> row_begin;    // rows + 1 offsets into items
  std::vector<int32_t> items;        // k indices, ascending within each row
  std::vector<int32_t> k_lo, k_hi;   // per Gaussian: first / last covered row (relative), lo > hi = none

  std::vector<int32_t> p_lo, p_hi;   // per Gaussian: pixel columns [p_lo, p_hi] of its x-extent in the tile

  // Pixels px in [x0, x1) whose centre px + 0.5 lies in Gaussian k's x-extent: [p0, p1] (empty if p0 > p1).
  void px_range(int64_t k, int64_t, int64_t, int64_t& p0, int64_t& p1) const {
    p0 = p_lo[k];
    p1 = p_hi[k];
  }

  // lx..lo: the tile's Gaussians (mean x/y, conic a/b/c, opacity); rows y0 .. y1-1 of the image.
  void build(int64_t K, const float* lx, const float* ly, const float* la, const float* lb, const float* lc,
             const float* lo, int64_t y0, int64_t y1, int64_t x0, int64_t x1) {
    const int64_t rows = y1 - y0;
    xlo.resize(K); xhi.resize(K); k_lo.resize(K); k_hi.resize(K); p_lo.resize(K); p_hi.resize(K);
    row_begin.assign(rows + 1, 0);
    for (int64_t k = 0; k < K; ++k) {
      k_lo[k] = 1; k_hi[k] = 0;
      p_lo[k] = 1; p_hi[k] = 0;
      const float o = lo[k];
      if (!(o * 255.0f > 1.0f)) continue;  // never reaches alpha 1/255
      const float s = std::min(std::log(255.0f * o), kSigmaSkip);
      const float det = la[k] * lc[k] - lb[k] * lb[k];
      float ex, ey;
      if (det > 0.0f && la[k] > 0.0f && lc[k] > 0.0f) {
        ex = std::sqrt(2.0f * s * lc[k] / det) * 1.001f + 0.01f;  // cov_xx = c / det
        ey = std::sqrt(2.0f * s * la[k] / det) * 1.001f + 0.01f;  // cov_yy = a / det
      } else {  // degenerate conic: no culling
        ex = ey = 1e30f;
      }
      if (!(ex < 1e29f)) ex = 1e30f;
      if (!(ey < 1e29f)) ey = 1e30f;
      xlo[k] = lx[k] - ex; xhi[k] = lx[k] + ex;
      const double c0 = std::ceil((double)xlo[k] - 0.5), c1 = std::floor((double)xhi[k] - 0.5);
      p_lo[k] = (int32_t)std::max<int64_t>(x0, (int64_t)std::max(c0, -1e15));
      p_hi[k] = (int32_t)std::min<int64_t>(x1 - 1, (int64_t)std::min(c1, 1e15));
      // rows whose centre (py + 0.5) lies in [ly - ey, ly + ey]
      const double r0 = std::ceil((double)ly[k] - ey - 0.5), r1 = std::floor((double)ly[k] + ey - 0.5);
      const int64_t a0 = std::max<int64_t>(y0, (int64_t)std::max(r0, -1e15)) - y0;
      const int64_t a1 = std::min<int64_t>(y1 - 1, (int64_t)std::min(r1, 1e15)) - y0;
      if (a0 > a1) continue;
      k_lo[k] = (int32_t)a0; k_hi[k] = (int32_t)a1;
      for (int64_t r = a0; r <= a1; ++r) ++row_begin[r + 1];
    }
    for (int64_t r = 0; r < rows; ++r) row_begin[r + 1] += row_begin[r];
    items.resize(row_begin[rows]);
    std::vector<int32_t> cur(row_begin.begin(), row_begin.end() - 1);
    for (int64_t k = 0; k < K; ++k)
      for (int32_t r = k_lo[k]; r <= k_hi[k]; ++r) items[cur[r]++] = (int32_t)k;
  }
};

}  // namespace rh3dgs
