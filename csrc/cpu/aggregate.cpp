// CPU backend of the per-Gaussian spherical aggregation used by the training-free lift.
//
// Walks every pixel front to back exactly like rasterize_fwd and, for each contribution
// w = alpha_i T_i(u) * pixel_weights(u) of Gaussian i, accumulates one step of the
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
#include <cmath>
#include <vector>

#include "../common.h"
#include "tile_rows.h"

namespace rh3dgs {
namespace {

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
  const int64_t n_work = B * TH * TW;

  std::vector<float> ext((size_t)2 * B * NB);
  gaussian_extents(B * NB, con, opac, ext.data());
#pragma omp parallel num_threads(n_threads)
  {
    const int tid = omp_get_thread_num();
    std::vector<float>& acc_w = th_w[tid];
    std::vector<float>& acc_raw = th_raw[tid];
    std::vector<float>& acc_v = th_v[tid];
    acc_w.assign(NG, 0.0f);
    acc_raw.assign(NG, 0.0f);
    acc_v.assign((size_t)NG * D, 0.0f);
    std::vector<float> lex, ley, lx, ly, la, lb, lc, lo;
    std::vector<int64_t> lg;
    TileRows rows;
#pragma omp for schedule(static, 1)
    for (int64_t work = 0; work < n_work; ++work) {
      const int64_t b = work / (TH * TW), tile = work % (TH * TW);
      const int64_t ty = tile / TW, tx = tile % TW;
      const int64_t flat = work;
      int64_t start, end;
      tile_bounds(offsets, flat, n_work, n_isects, start, end);
      if (end <= start) continue;
      const int64_t K = end - start;
      lx.resize(K); ly.resize(K); lex.resize(K); ley.resize(K); la.resize(K); lb.resize(K); lc.resize(K); lo.resize(K); lg.resize(K);
      for (int64_t k = 0; k < K; ++k) {  // tile-local copies (structure of arrays)
        const int64_t g = fids[start + k];
        lx[k] = xy[2 * g]; ly[k] = xy[2 * g + 1];
        lex[k] = ext[2 * g]; ley[k] = ext[2 * g + 1];
        la[k] = con[3 * g]; lb[k] = con[3 * g + 1]; lc[k] = con[3 * g + 2];
        lo[k] = opac[g]; lg[k] = g % NB;  // flatten_ids index b * N + n
      }
      const int64_t y0 = ty * tile_size, x0 = tx * tile_size;
      const int64_t y1 = std::min<int64_t>(y0 + tile_size, H), x1 = std::min<int64_t>(x0 + tile_size, W);
      rows.build(K, lx.data(), ly.data(), lex.data(), ley.data(), y0, y1, x0, x1);
      for (int64_t py = y0; py < y1; ++py) {
        const int32_t* row = rows.items.data() + rows.row_begin[py - y0];
        const int64_t n_row = rows.row_begin[py - y0 + 1] - rows.row_begin[py - y0];
        for (int64_t px = x0; px < x1; ++px) {
          const int64_t pix = (b * H + py) * W + px;
          const float pweight = pw[pix];
          if (!(pweight > 0.0f)) continue;
          const float* z = pf + pix * D;
          const float fx = (float)px + 0.5f, fy = (float)py + 0.5f;
          float T = 1.0f;
          for (int64_t j = 0; j < n_row; ++j) {
            const int64_t k = row[j];
            if (fx < rows.xlo[k] || fx > rows.xhi[k]) continue;
            const float dx = lx[k] - fx, dy = ly[k] - fy;
            float a, vis;
            if (!gauss_alpha(la[k], lb[k], lc[k], lo[k], dx, dy, a, vis)) continue;
            const float next_T = T * (1.0f - a);
            if (next_T <= kTransmittanceMin) break;
            const float w = a * T * pweight;
            T = next_T;
            const int64_t gi = lg[k];
            float* v = acc_v.data() + gi * D;
            acc_raw[gi] += w;
            if (mode == 0) {
              acc_w[gi] += w;
#pragma omp simd
              for (int64_t d = 0; d < D; ++d) v[d] += w * z[d];
              continue;
            }
            const float* mi = m + gi * D;
            float cosv = 0.0f;
#pragma omp simd reduction(+ : cosv)
            for (int64_t d = 0; d < D; ++d) cosv += mi[d] * z[d];
            cosv = std::max(-1.0f, std::min(1.0f, cosv));
            // |z| = |mu| = 1: sin(theta) = sqrt(1 - cos^2). Its rounding near theta = 0 only
            // perturbs theta / sin(theta) = 1 + O(theta^2), so the tangent step stays accurate.
            const float sinv = std::sqrt(std::max(0.0f, 1.0f - cosv * cosv));
            const float theta = std::atan2(sinv, cosv);
            const float omega = (theta > fdelta) ? w * fdelta / theta : w;
            acc_w[gi] += omega;
            // theta / sin(theta) -> 1 as theta -> 0 (at the antipode z - cos mu = 0 anyway)
            const float scale = (sinv > 1e-12f) ? omega * theta / sinv : omega;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) v[d] += scale * (z[d] - cosv * mi[d]);
          }
        }
      }
    }
  }

  auto fopt = means2d.options();
  auto out_w = at::zeros({NG}, fopt), out_v = at::zeros({NG, D}, fopt), out_raw = at::zeros({NG}, fopt);
  float* ow = out_w.data_ptr<float>();
  float* ov = out_v.data_ptr<float>();
  float* oraw = out_raw.data_ptr<float>();
  for (int t = 0; t < n_threads; ++t) {  // fixed order: deterministic
    if (th_w[t].empty()) continue;
    for (int64_t g = 0; g < NG; ++g) { ow[g] += th_w[t][g]; oraw[g] += th_raw[t][g]; }
    for (int64_t k = 0; k < NG * D; ++k) ov[k] += th_v[t][k];
  }
  return {out_w, out_v, out_raw};
}

}  // namespace

TORCH_LIBRARY_IMPL(rh3dgs, CPU, m) { m.impl("aggregate_sphere", &aggregate_sphere_cpu); }

}  // namespace rh3dgs
