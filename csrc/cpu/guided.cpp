// CPU backend of the joint bilateral upsampling of a coarse teacher map (the lift's guided maps).
//
// For a map m [h, w, D], the guide image I [H, W, 3] and the mean colour of each cell's footprint
// gbar [h, w, 3] (each with a leading batch of B views: one output [B, H, W, D], the lift's chunk of maps
// without a copy into a stack), pixel p (position py, px in cell units, own cell (cy, cx)) takes the
// cells q of the (2 r + 1)^2 neighbourhood of its cell (zero outside the map, and for rows of m that are ~0):
//   w_q = exp(-|p - q|^2 / (2 sigma_s^2) - |I(p) - gbar_q|^2 / (2 sigma_c^2))   (0 where m_q = 0)
//   out(p) = normalize(sum_q w_q m_q), 0 where sum_q w_q < min_support.
// The torch reference is rh3dgs.ops._ref._ref_guided_upsample (one small matrix product per cell);
// here one pass over the pixels, the neighbour rows read from cache (the pixels of a cell share them), exp
// as fastmath.h's exp_neg (relative error 2e-7), 0 below exp(-87) (where float's underflows).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "dispatch.h"
#include "fastmath.h"
#include "huge_alloc.h"
#include "vec16.h"

namespace rh3dgs {
namespace {

// out[0 .. D) = normalize(sum_j wq[j] mq[j][0 .. D)) over nq rows (0 where the sum is 0). CT = D a multiple
// of 16 known at compile time: the sums in registers (in memory, each cell's multiply-adds waited on the
// previous cell's stores) and the norm a shuffle-tree sum; else the generic loops over acc (D floats).
template <int CT>
inline void blend_unit(const float* wq, const float* const* mq, int nq, int64_t D, float* acc, float* out) {
  constexpr int kV = (CT > 0 && CT % 16 == 0) ? CT / 16 : 0;
  const auto inv_norm = [](float n2) {  // 1 / |sum|, 0 for a zero sum
    const float n = std::sqrt(n2);
    return n > 0.0f ? 1.0f / std::max(n, 1e-30f) : 0.0f;
  };
  float n2 = 0.0f;
  if constexpr (kV > 0) {
    vf16 a[kV] = {};
    for (int j = 0; j < nq; ++j)
      for (int u = 0; u < kV; ++u) a[u] += wq[j] * load16(mq[j] + 16 * u);
    vf16 sq{};
    for (int u = 0; u < kV; ++u) sq += a[u] * a[u];
    n2 = hsum16(sq);
    const float inv = inv_norm(n2);
    for (int u = 0; u < kV; ++u) store16(out + 16 * u, a[u] * inv);
  } else {
    std::fill(acc, acc + D, 0.0f);
    for (int j = 0; j < nq; ++j) {
      const float wt = wq[j];
      const float* f = mq[j];
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) acc[d] += wt * f[d];
    }
#pragma omp simd reduction(+ : n2)
    for (int64_t d = 0; d < D; ++d) n2 += acc[d] * acc[d];
    const float inv = inv_norm(n2);
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) out[d] = acc[d] * inv;
  }
}

at::Tensor guided_upsample_cpu(const at::Tensor& map_, const at::Tensor& guide_, const at::Tensor& cell_colors_,
                               double sigma_color, double sigma_space, int64_t radius, double min_support) {
  TORCH_CHECK(map_.dim() == 4 && map_.scalar_type() == at::kFloat, "map must be float [B, h, w, D]");
  TORCH_CHECK(guide_.dim() == 4 && guide_.size(0) == map_.size(0) && guide_.size(3) == 3 &&
                  guide_.scalar_type() == at::kFloat,
              "guide must be float [B, H, W, 3] like the map's batch");
  const int64_t B = map_.size(0), h = map_.size(1), w = map_.size(2), D = map_.size(3);
  const int64_t H = guide_.size(1), W = guide_.size(2);
  TORCH_CHECK(cell_colors_.sizes() == at::IntArrayRef({B, h, w, 3}) && cell_colors_.scalar_type() == at::kFloat,
              "cell_colors must be float [B, h, w, 3] like the map's cells");
  TORCH_CHECK(h >= 1 && w >= 1 && H >= h && W >= w, "guided_upsample: the guide [", H, ", ", W,
              "] must be at least as large as the map [", h, ", ", w, "]");
  TORCH_CHECK(radius >= 0, "radius must be >= 0");
  const auto map = map_.contiguous(), guide = guide_.contiguous(), gbar = cell_colors_.contiguous();
  const float* m_all = map.data_ptr<float>();
  const float* I_all = guide.data_ptr<float>();
  const float* gb_all = gbar.data_ptr<float>();
  auto out = empty_huge({B, H, W, D}, map.options());  // a lift upsamples a chunk of views: pooled pages, no faults
  float* o_all = out.data_ptr<float>();
  // cells with a feature (the reference's |m_q| > 1e-8)
  std::vector<uint8_t> has_all(B * h * w);
  for (int64_t q = 0; q < B * h * w; ++q) {
    float n2 = 0.0f;
    for (int64_t d = 0; d < D; ++d) n2 += m_all[q * D + d] * m_all[q * D + d];
    has_all[q] = std::sqrt(n2) > 1e-8f;
  }
  const float is = (float)(1.0 / (2.0 * sigma_space * sigma_space));
  const float ic = (float)(1.0 / (2.0 * sigma_color * sigma_color));
  const float support_min = (float)min_support;
  const int64_t r = radius, k = 2 * radius + 1;
  // a pixel's position in cell units and its own cell (round half to even, as torch.round)
  auto cell_of = [](int64_t i, int64_t cells, int64_t size, float& pos) {
    pos = ((float)i + 0.5f) * (float)cells / (float)size - 0.5f;
    return std::min<int64_t>(cells - 1, std::max<int64_t>(0, (int64_t)std::nearbyint(pos)));
  };
  dispatch_feature_dims(D, [&](auto ct) {
    constexpr int CT = decltype(ct)::value;  // D when compiled for it, else 0
    at::parallel_for(0, B * H, 1, [&](int64_t r0, int64_t r1) {
      std::vector<float> wq(k * k);
      std::vector<const float*> mq(k * k);
      std::vector<float> acc(D);
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t b = row / H, y = row % H;  // view b's pixel row y
        const float* m = m_all + b * h * w * D;
        const float* I = I_all + b * H * W * 3;
        const float* gb = gb_all + b * h * w * 3;
        const uint8_t* has = has_all.data() + b * h * w;
        float* o = o_all + b * H * W * D;
        float py;
        const int64_t cy = cell_of(y, h, H, py);
        for (int64_t x = 0; x < W; ++x) {
          float px;
          const int64_t cx = cell_of(x, w, W, px);
          const float* ip = I + (y * W + x) * 3;
          float support = 0.0f;
          int nq = 0;
          for (int64_t dy = -r; dy <= r; ++dy) {
            const int64_t qy = cy + dy;
            if (qy < 0 || qy >= h) continue;
            const float ddy = py - (float)qy;
            for (int64_t dx = -r; dx <= r; ++dx) {
              const int64_t qx = cx + dx;
              if (qx < 0 || qx >= w || !has[qy * w + qx]) continue;
              const float ddx = px - (float)qx;
              const float* c = gb + (qy * w + qx) * 3;
              const float e0 = ip[0] - c[0], e1 = ip[1] - c[1], e2 = ip[2] - c[2];
              const float x = -(ddy * ddy + ddx * ddx) * is - (e0 * e0 + e1 * e1 + e2 * e2) * ic;
              const float wt = x > -87.0f ? exp_neg(x) : 0.0f;  // float exp underflows there anyway
              support += wt;
              wq[nq] = wt, mq[nq] = m + (qy * w + qx) * D, ++nq;
            }
          }
          float* op = o + (y * W + x) * D;
          if (!(support >= support_min) || nq == 0) {
            std::fill(op, op + D, 0.0f);
            continue;
          }
          blend_unit<CT>(wq.data(), mq.data(), nq, D, acc.data(), op);
        }
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(rh3dgs, CPU, m) { m.impl("guided_upsample", &guided_upsample_cpu); }

}  // namespace rh3dgs
