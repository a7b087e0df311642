// CPU backend of the per-Gaussian spherical aggregation used by the training-free lift.
//
// Walks every pixel front to back like rasterize_fwd (the same row traversal, composite_row) and,
// for each contribution w = alpha_i T_i(u) * pixel_weights(u) of Gaussian i, accumulates one step of the
// Huber-IRLS Frechet mean (see ext.cpp for the contract). Nothing per (pixel, Gaussian)
// is stored.
//
// Determinism: each thread accumulates into its own buffers over a static round-robin
// tile schedule, and the buffers are summed in thread order, so the result is
// bit-identical between runs with the same thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <torch/library.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <cmath>
#include <vector>

#include "../common.h"
#include "dispatch.h"
#include "reduce.h"
#include "row_alpha.h"
#include "tile_rows.h"
#include "vec16.h"

namespace rh3dgs {
namespace {

// Accumulators of one Gaussian over one row segment: raw weight, mean weight (w or omega) and
// the D-vector (w z or omega Log_mu z). With a compile-time D that is a multiple of 16 the vector
// lives in registers; otherwise in a scratch buffer.
template <int CT>
struct SegmentSums {
  static constexpr int kV = (CT > 0 && CT % 16 == 0) ? CT / 16 : 0;
  float raw = 0.0f, wsum = 0.0f, mu_coef = 0.0f;  // mu_coef: IRLS, sum of scale * cos
  vf16 v16[kV > 0 ? kV : 1] = {};
  float* v;  // generic path
  explicit SegmentSums(float* scratch, int64_t D) : v(scratch) {
    if constexpr (kV == 0) std::fill(v, v + D, 0.0f);
  }
};

// One aggregation pass over the tiles of B views (mode 0: init, 1: IRLS step).
template <int CT, int MODE>
void aggregate_tiles(int64_t B, int64_t NB, int64_t H, int64_t W, int64_t D_rt, int64_t TH, int64_t TW,
                     int64_t tile_size, int64_t n_isects, const PackedGaussian* pg, const float* pf, const float* pw,
                     const float* m, const int32_t* offsets, const int32_t* fids, float fdelta, int n_threads,
                     std::vector<std::vector<float>>& th_w, std::vector<std::vector<float>>& th_raw,
                     std::vector<std::vector<float>>& th_v, int64_t NG) {
  const int64_t D = CT > 0 ? CT : D_rt;
  constexpr int kV = SegmentSums<CT>::kV;
  const int64_t n_work = B * TH * TW;
#pragma omp parallel num_threads(n_threads)
  {
    const int tid = omp_get_thread_num();
    std::vector<float>& acc_w = th_w[tid];
    std::vector<float>& acc_raw = th_raw[tid];
    std::vector<float>& acc_v = th_v[tid];
    acc_w.assign(NG, 0.0f);
    acc_raw.assign(NG, 0.0f);
    acc_v.assign((size_t)NG * D, 0.0f);
    TileGaussians tg;  // the tile's Gaussians (structure of arrays)
    std::vector<int64_t> lg;
    // per-row lanes (one per pixel of the tile row)
    const int64_t L = row_alpha_capacity(tile_size);
    std::vector<float> rT(L), rpw(L), ralpha(L), rvis(L), scratch(D), prod(D);
    std::vector<int32_t> rlimit(L);
    TileRows rows;
#pragma omp for schedule(static, 1)
    for (int64_t work = 0; work < n_work; ++work) {
      int64_t start, end;
      tile_bounds(offsets, work, n_work, n_isects, start, end);
      if (end <= start) continue;
      const auto [b, y0, y1, x0, x1] = tile_rect(work, TH, TW, tile_size, H, W);
      const int64_t K = end - start;
      tg.gather(pg, fids, start, K);
      lg.resize(K);
      for (int64_t k = 0; k < K; ++k) lg[k] = fids[start + k] % NB;  // flatten_ids index b * N + n
      const int64_t nx = x1 - x0;
      rows.build(tg, y0, y1, x0, x1);
      for (int64_t py = y0; py < y1; ++py) {
        // Gaussian-major over this row (depth order); per pixel the contributions and their
        // order are those of a front-to-back scan that stops where T would reach 1e-4.
        const float fy = (float)py + 0.5f;
        const int64_t pix0 = (b * H + py) * W + x0;
        const float* zrow = pf + pix0 * D;
        int64_t n_open = 0;
        for (int64_t l = 0; l < L; ++l) {
          rT[l] = 1.0f;
          rpw[l] = l < nx ? pw[pix0 + l] : 0.0f;
          const bool open = rpw[l] > 0.0f;  // pixels of weight 0 (or NaN) contribute nothing
          rlimit[l] = open ? std::numeric_limits<int32_t>::max() : -1;
          n_open += open;
        }
        composite_row(tg, rows, py - y0, fy, x0, L, n_open, rT.data(), rlimit.data(), ralpha.data(), rvis.data(),
                      [&](int64_t k, auto&& pairs) {
          const int64_t gi = lg[k];
          const float* mi = m + gi * D;
          SegmentSums<CT> sums(scratch.data(), D);
          pairs([&](int64_t l, float a, float T) {
            const float w = a * T * rpw[l];
            sums.raw += w;
            const float* z = zrow + l * D;
            if constexpr (MODE == 0) {
              sums.wsum += w;
              if constexpr (kV > 0) {
                for (int u = 0; u < kV; ++u) sums.v16[u] += w * load16(z + 16 * u);
              } else {
#pragma omp simd
                for (int64_t d = 0; d < D; ++d) sums.v[d] += w * z[d];
              }
              return;
            }
            float cosv;
            if constexpr (kV > 0) {
              vf16 dot{};
              for (int u = 0; u < kV; ++u) dot += load16(mi + 16 * u) * load16(z + 16 * u);
              cosv = hsum16(dot);
            } else {
#pragma omp simd
              for (int64_t d = 0; d < D; ++d) prod[d] = mi[d] * z[d];
              cosv = tree_sum<CT>(prod.data(), D);
            }
            cosv = std::max(-1.0f, std::min(1.0f, cosv));
            // |z| = |mu| = 1: sin(theta) = sqrt(1 - cos^2). Its rounding near theta = 0 only
            // perturbs theta / sin(theta) = 1 + O(theta^2), so the tangent step stays accurate.
            const float sinv = std::sqrt(std::max(0.0f, 1.0f - cosv * cosv));
            const float theta = atan2_pos(sinv, cosv);
            const float omega = (theta > fdelta) ? w * fdelta / theta : w;
            sums.wsum += omega;
            // theta / sin(theta) -> 1 as theta -> 0 (at the antipode z - cos mu = 0 anyway)
            const float scale = (sinv > 1e-12f) ? omega * theta / sinv : omega;
            // scale (z - cos mu): the mu part summed as a scalar, applied once per row
            sums.mu_coef += scale * cosv;
            if constexpr (kV > 0) {
              for (int u = 0; u < kV; ++u) sums.v16[u] += scale * load16(z + 16 * u);
            } else {
#pragma omp simd
              for (int64_t d = 0; d < D; ++d) sums.v[d] += scale * z[d];
            }
          });
          if constexpr (MODE == 1) {
            if constexpr (kV > 0) {
              for (int u = 0; u < kV; ++u) sums.v16[u] -= sums.mu_coef * load16(mi + 16 * u);
            } else {
#pragma omp simd
              for (int64_t d = 0; d < D; ++d) sums.v[d] -= sums.mu_coef * mi[d];
            }
          }
          acc_raw[gi] += sums.raw;
          acc_w[gi] += sums.wsum;
          float* v = acc_v.data() + gi * D;
          if constexpr (kV > 0) {
            for (int u = 0; u < kV; ++u) store16(v + 16 * u, load16(v + 16 * u) + sums.v16[u]);
          } else {
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) v[d] += sums.v[d];
          }
        });
      }
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> aggregate_sphere_cpu(
    const at::Tensor& means2d_, const at::Tensor& conics_, const at::Tensor& opacities_,
    const at::Tensor& pixel_feats_, const at::Tensor& pixel_weights_, const at::Tensor& mu_, double delta,
    int64_t mode, int64_t num_gaussians, int64_t tile_size, const at::Tensor& isect_offsets_,
    const at::Tensor& flatten_ids_) {
  TORCH_CHECK(means2d_.dim() == 3 && means2d_.size(2) == 2, "means2d must be [B,N,2]");
  const int64_t B = means2d_.size(0), NB = means2d_.size(1);
  TORCH_CHECK(pixel_feats_.dim() == 4 && pixel_feats_.size(0) == B, "pixel_feats must be [B,H,W,D]");
  const int64_t H = pixel_feats_.size(1), W = pixel_feats_.size(2), D = pixel_feats_.size(3);
  TORCH_CHECK(pixel_weights_.sizes() == at::IntArrayRef({B, H, W}), "pixel_weights must be [B,H,W]");
  TORCH_CHECK(mode == 0 || mode == 1, "mode must be 0 (init) or 1 (IRLS step)");
  // one bit per pixel of a tile row in lane_mask()
  TORCH_CHECK(tile_size >= 1 && tile_size <= 64, "tile_size must be in [1, 64], got ", tile_size);
  TORCH_CHECK(num_gaussians == NB, "num_gaussians must equal means2d.size(1)");
  TORCH_CHECK(mu_.dim() == 2 && mu_.size(0) == num_gaussians && mu_.size(1) == D, "mu must be [num_gaussians, D]");
  TORCH_CHECK(isect_offsets_.scalar_type() == at::kInt && flatten_ids_.scalar_type() == at::kInt,
              "isect_offsets and flatten_ids must be int32");
  for (const auto* t : {&means2d_, &conics_, &opacities_, &pixel_feats_, &pixel_weights_, &mu_}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat, "aggregate_sphere expects float32 tensors");
  }
  const auto means2d = means2d_.contiguous(), conics = conics_.contiguous(), opacities = opacities_.contiguous();
  const auto pixel_feats = pixel_feats_.contiguous(), pixel_weights = pixel_weights_.contiguous();
  const auto mu = mu_.contiguous();
  const auto isect_offsets = isect_offsets_.contiguous(), flatten_ids = flatten_ids_.contiguous();
  const int64_t TH = isect_offsets.size(1), TW = isect_offsets.size(2);
  const int64_t n_isects = flatten_ids.numel();
  const int64_t NG = num_gaussians;

  const float* xy = means2d.data_ptr<float>();
  const float* con = conics.data_ptr<float>();
  const float* opac = opacities.data_ptr<float>();
  const float* pf = pixel_feats.data_ptr<float>();
  const float* pw = pixel_weights.data_ptr<float>();
  const float* m = mu.data_ptr<float>();
  const int32_t* offsets = isect_offsets.data_ptr<int32_t>();
  const int32_t* fids = flatten_ids.data_ptr<int32_t>();
  const float fdelta = (float)delta;

  const int n_threads = std::max(1, at::get_num_threads());
  std::vector<std::vector<float>> th_w(n_threads), th_raw(n_threads), th_v(n_threads);
  const std::vector<PackedGaussian> packed = pack_gaussians(B * NB, xy, con, opac);
  dispatch_channels(D, [&](auto ct) {
    constexpr int CT = decltype(ct)::value;
    auto run = [&](auto kernel) {
      kernel(B, NB, H, W, D, TH, TW, tile_size, n_isects, packed.data(), pf, pw, m, offsets, fids, fdelta,
             n_threads, th_w, th_raw, th_v, NG);
    };
    if (mode == 0) run(aggregate_tiles<CT, 0>); else run(aggregate_tiles<CT, 1>);
  });

  // Sum the per-thread buffers in thread order (deterministic), in parallel over Gaussians.
  auto fopt = means2d.options();
  auto out_w = at::zeros({NG}, fopt), out_v = at::zeros({NG, D}, fopt), out_raw = at::zeros({NG}, fopt);
  float* ow = out_w.data_ptr<float>();
  float* ov = out_v.data_ptr<float>();
  float* oraw = out_raw.data_ptr<float>();
  at::parallel_for(0, NG, 1024, [&](int64_t g0, int64_t g1) {
    for (int t = 0; t < n_threads; ++t) {
      if (th_w[t].empty()) continue;  // a thread OpenMP did not start
      for (int64_t g = g0; g < g1; ++g) { ow[g] += th_w[t][g]; oraw[g] += th_raw[t][g]; }
      for (int64_t k = g0 * D; k < g1 * D; ++k) ov[k] += th_v[t][k];
    }
  });
  return {out_w, out_v, out_raw};
}

}  // namespace

TORCH_LIBRARY_IMPL(rh3dgs, CPU, m) { m.impl("aggregate_sphere", &aggregate_sphere_cpu); }

}  // namespace rh3dgs
