// CPU backend of the rh3dgs rasterization core: tile-based front-to-back compositing of
// N-D features with render statistics (A, D1, D2), forward and backward.
//
// Parallelism: OpenMP over (camera, tile) with a static schedule. In the backward pass
// every tile owns the rows of its intersections in per-intersection gradient buffers,
// which are then reduced serially per Gaussian, so results are deterministic and free
// of atomics for any thread count.
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

struct TileRange {
  int64_t start, end;
};

void check_inputs(const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& features,
                  const at::Tensor& opacities, const at::Tensor& depths, const c10::optional<at::Tensor>& backgrounds,
                  const at::Tensor& isect_offsets, const at::Tensor& flatten_ids) {
  TORCH_CHECK(means2d.dim() == 3 && means2d.size(2) == 2, "means2d must be [B,N,2]");
  const auto B = means2d.size(0), N = means2d.size(1);
  TORCH_CHECK(conics.sizes() == at::IntArrayRef({B, N, 3}), "conics must be [B,N,3]");
  TORCH_CHECK(features.dim() == 3 && features.size(0) == B && features.size(1) == N, "features must be [B,N,C]");
  TORCH_CHECK(opacities.sizes() == at::IntArrayRef({B, N}), "opacities must be [B,N]");
  TORCH_CHECK(depths.sizes() == at::IntArrayRef({B, N}), "depths must be [B,N]");
  if (backgrounds.has_value()) {
    TORCH_CHECK(backgrounds->sizes() == at::IntArrayRef({B, features.size(2)}), "backgrounds must be [B,C]");
  }
  TORCH_CHECK(isect_offsets.dim() == 3 && isect_offsets.size(0) == B, "isect_offsets must be [B,TH,TW]");
  TORCH_CHECK(isect_offsets.scalar_type() == at::kInt && flatten_ids.scalar_type() == at::kInt,
              "isect_offsets and flatten_ids must be int32");
  for (const auto* t : {&means2d, &conics, &features, &opacities, &depths}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat, "rh3dgs rasterizer expects float32 tensors");
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rasterize_fwd_cpu(
    const at::Tensor& means2d_, const at::Tensor& conics_, const at::Tensor& features_,
    const at::Tensor& opacities_, const at::Tensor& depths_, const c10::optional<at::Tensor>& backgrounds_,
    int64_t width, int64_t height, int64_t tile_size, const at::Tensor& isect_offsets_,
    const at::Tensor& flatten_ids_) {
  check_inputs(means2d_, conics_, features_, opacities_, depths_, backgrounds_, isect_offsets_, flatten_ids_);
  const auto means2d = means2d_.contiguous(), conics = conics_.contiguous(), features = features_.contiguous();
  const auto opacities = opacities_.contiguous(), depths = depths_.contiguous();
  const auto isect_offsets = isect_offsets_.contiguous(), flatten_ids = flatten_ids_.contiguous();
  at::Tensor backgrounds;
  if (backgrounds_.has_value()) backgrounds = backgrounds_->contiguous();

  const int64_t B = means2d.size(0), N = means2d.size(1), C = features.size(2);
  const int64_t TH = isect_offsets.size(1), TW = isect_offsets.size(2);
  const int64_t n_isects = flatten_ids.numel();
  auto fopt = means2d.options();
  auto render = at::zeros({B, height, width, C}, fopt);
  auto alpha = at::zeros({B, height, width}, fopt);
  auto d1 = at::zeros({B, height, width}, fopt);
  auto d2 = at::zeros({B, height, width}, fopt);
  auto last_ids = at::full({B, height, width}, -1, fopt.dtype(at::kInt));

  const float* xy = means2d.data_ptr<float>();
  const float* con = conics.data_ptr<float>();
  const float* feat = features.data_ptr<float>();
  const float* opac = opacities.data_ptr<float>();
  const float* dep = depths.data_ptr<float>();
  const float* bg = backgrounds.defined() ? backgrounds.data_ptr<float>() : nullptr;
  const int32_t* offsets = isect_offsets.data_ptr<int32_t>();
  const int32_t* fids = flatten_ids.data_ptr<int32_t>();
  float* out = render.data_ptr<float>();
  float* out_a = alpha.data_ptr<float>();
  float* out_d1 = d1.data_ptr<float>();
  float* out_d2 = d2.data_ptr<float>();
  int32_t* out_last = last_ids.data_ptr<int32_t>();
  (void)N;

  const int64_t n_work = B * TH * TW;
#pragma omp parallel num_threads(at::get_num_threads())
  {
    // Tile-local copies of the Gaussian parameters (structure of arrays).
    std::vector<float> lx, ly, la, lb, lc, lo, lz, lf;
    // per-row pixel state (at most tile_size pixels)
    std::vector<float> rT(tile_size), rd1(tile_size), rd2(tile_size), racc(tile_size * C);
    std::vector<int32_t> rlast(tile_size);
    std::vector<uint8_t> rdone(tile_size);
    TileRows rows;
#pragma omp for schedule(dynamic, 1)
    for (int64_t work = 0; work < n_work; ++work) {
      const int64_t b = work / (TH * TW), tile = work % (TH * TW);
      const int64_t ty = tile / TW, tx = tile % TW;
      TileRange r;
      tile_bounds(offsets, work, n_work, n_isects, r.start, r.end);
      const int64_t K = r.end - r.start;
      lx.resize(K); ly.resize(K); la.resize(K); lb.resize(K); lc.resize(K); lo.resize(K); lz.resize(K);
      lf.resize(K * C);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t g = fids[r.start + k];
        lx[k] = xy[2 * g]; ly[k] = xy[2 * g + 1];
        la[k] = con[3 * g]; lb[k] = con[3 * g + 1]; lc[k] = con[3 * g + 2];
        lo[k] = opac[g]; lz[k] = dep[g];
        std::copy(feat + g * C, feat + (g + 1) * C, lf.data() + k * C);
      }
      const int64_t y0 = ty * tile_size, x0 = tx * tile_size;
      const int64_t y1 = std::min<int64_t>(y0 + tile_size, height), x1 = std::min<int64_t>(x0 + tile_size, width);
      rows.build(K, lx.data(), ly.data(), la.data(), lb.data(), lc.data(), lo.data(), y0, y1, x0, x1);
      const int64_t nx = x1 - x0;
      for (int64_t py = y0; py < y1; ++py) {
        // Gaussian-major over this row: each Gaussian visits only the pixels of its x-extent;
        // per pixel the operations and their order are those of a front-to-back scan.
        const int32_t* row = rows.items.data() + rows.row_begin[py - y0];
        const int64_t n_row = rows.row_begin[py - y0 + 1] - rows.row_begin[py - y0];
        const float fy = (float)py + 0.5f;
        std::fill(rT.begin(), rT.begin() + nx, 1.0f);
        std::fill(rd1.begin(), rd1.begin() + nx, 0.0f);
        std::fill(rd2.begin(), rd2.begin() + nx, 0.0f);
        std::fill(rlast.begin(), rlast.begin() + nx, -1);
        std::fill(rdone.begin(), rdone.begin() + nx, 0);
        std::fill(racc.begin(), racc.begin() + nx * C, 0.0f);
        int64_t active = nx;
        for (int64_t j = 0; j < n_row && active > 0; ++j) {
          const int64_t k = row[j];
          int64_t p0, p1;
          rows.px_range(k, x0, x1, p0, p1);
          const float* f = lf.data() + k * C;
          for (int64_t px = p0; px <= p1; ++px) {
            const int64_t q = px - x0;
            if (rdone[q]) continue;
            const float fx = (float)px + 0.5f;
            const float dx = lx[k] - fx, dy = ly[k] - fy;
            float a, vis;
            if (!gauss_alpha(la[k], lb[k], lc[k], lo[k], dx, dy, a, vis)) continue;
            const float next_T = rT[q] * (1.0f - a);
            if (next_T <= kTransmittanceMin) {
              rdone[q] = 1;
              --active;
              continue;
            }
            const float w = a * rT[q];
            float* acc = racc.data() + q * C;
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) acc[c] += w * f[c];
            rd1[q] += w * lz[k];
            rd2[q] += w * lz[k] * lz[k];
            rT[q] = next_T;
            rlast[q] = (int32_t)(r.start + k);
          }
        }
        for (int64_t q = 0; q < nx; ++q) {
          const int64_t pix = (b * height + py) * width + x0 + q;
          float* o = out + pix * C;
          const float* acc = racc.data() + q * C;
          for (int64_t c = 0; c < C; ++c) o[c] = acc[c] + (bg ? rT[q] * bg[b * C + c] : 0.0f);
          out_a[pix] = 1.0f - rT[q];
          out_d1[pix] = rd1[q];
          out_d2[pix] = rd2[q];
          out_last[pix] = rlast[q];
        }
      }
    }
  }
  return {render, alpha, d1, d2, last_ids};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rasterize_bwd_cpu(
    const at::Tensor& means2d_, const at::Tensor& conics_, const at::Tensor& features_,
    const at::Tensor& opacities_, const at::Tensor& depths_, const c10::optional<at::Tensor>& backgrounds_,
    int64_t width, int64_t height, int64_t tile_size, const at::Tensor& isect_offsets_,
    const at::Tensor& flatten_ids_, const at::Tensor& alpha_, const at::Tensor& last_ids_,
    const at::Tensor& v_render_, const at::Tensor& v_alpha_, const at::Tensor& v_d1_, const at::Tensor& v_d2_) {
  check_inputs(means2d_, conics_, features_, opacities_, depths_, backgrounds_, isect_offsets_, flatten_ids_);
  const auto means2d = means2d_.contiguous(), conics = conics_.contiguous(), features = features_.contiguous();
  const auto opacities = opacities_.contiguous(), depths = depths_.contiguous();
  const auto isect_offsets = isect_offsets_.contiguous(), flatten_ids = flatten_ids_.contiguous();
  const auto alpha = alpha_.contiguous(), last_ids = last_ids_.contiguous();
  const auto v_render = v_render_.contiguous(), v_alpha = v_alpha_.contiguous();
  const auto v_d1 = v_d1_.contiguous(), v_d2 = v_d2_.contiguous();
  at::Tensor backgrounds;
  if (backgrounds_.has_value()) backgrounds = backgrounds_->contiguous();

  const int64_t B = means2d.size(0), N = means2d.size(1), C = features.size(2);
  const int64_t TH = isect_offsets.size(1), TW = isect_offsets.size(2);
  const int64_t n_isects = flatten_ids.numel();
  // Per-intersection gradient rows: [xy(2), conic(3), opacity(1), depth(1), features(C)].
  const int64_t S = 7 + C;
  std::vector<float> isect_grad((size_t)n_isects * S, 0.0f);

  const float* xy = means2d.data_ptr<float>();
  const float* con = conics.data_ptr<float>();
  const float* feat = features.data_ptr<float>();
  const float* opac = opacities.data_ptr<float>();
  const float* dep = depths.data_ptr<float>();
  const float* bg = backgrounds.defined() ? backgrounds.data_ptr<float>() : nullptr;
  const int32_t* offsets = isect_offsets.data_ptr<int32_t>();
  const int32_t* fids = flatten_ids.data_ptr<int32_t>();
  const float* A = alpha.data_ptr<float>();
  const int32_t* lasts = last_ids.data_ptr<int32_t>();
  const float* vr = v_render.data_ptr<float>();
  const float* va = v_alpha.data_ptr<float>();
  const float* vd1 = v_d1.data_ptr<float>();
  const float* vd2 = v_d2.data_ptr<float>();

  const int64_t n_work = B * TH * TW;
#pragma omp parallel num_threads(at::get_num_threads())
  {
    std::vector<float> lx, ly, la, lb, lc, lo;
    // per-row pixel state (at most tile_size pixels)
    std::vector<float> rT(tile_size), rTf(tile_size), rbg(tile_size), rb1(tile_size), rb2(tile_size);
    std::vector<float> rbuf(tile_size * C);
    std::vector<int32_t> rlastk(tile_size);
    TileRows rows;
#pragma omp for schedule(dynamic, 1)
    for (int64_t work = 0; work < n_work; ++work) {
      const int64_t b = work / (TH * TW), tile = work % (TH * TW);
      const int64_t ty = tile / TW, tx = tile % TW;
      TileRange r;
      tile_bounds(offsets, work, n_work, n_isects, r.start, r.end);
      if (r.end <= r.start) continue;
      const int64_t K = r.end - r.start;
      lx.resize(K); ly.resize(K); la.resize(K); lb.resize(K); lc.resize(K); lo.resize(K);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t g = fids[r.start + k];
        lx[k] = xy[2 * g]; ly[k] = xy[2 * g + 1];
        la[k] = con[3 * g]; lb[k] = con[3 * g + 1]; lc[k] = con[3 * g + 2];
        lo[k] = opac[g];
      }
      const int64_t y0 = ty * tile_size, x0 = tx * tile_size;
      const int64_t y1 = std::min<int64_t>(y0 + tile_size, height), x1 = std::min<int64_t>(x0 + tile_size, width);
      rows.build(K, lx.data(), ly.data(), la.data(), lb.data(), lc.data(), lo.data(), y0, y1, x0, x1);
      const int64_t nx = x1 - x0;
      for (int64_t py = y0; py < y1; ++py) {
        // Gaussian-major, back to front over this row; per pixel the same operations in the
        // same order as a per-pixel back-to-front scan from its last contributor.
        const int32_t* row = rows.items.data() + rows.row_begin[py - y0];
        const int64_t n_row = rows.row_begin[py - y0 + 1] - rows.row_begin[py - y0];
        const float fy = (float)py + 0.5f;
        int64_t active = 0;
        for (int64_t q = 0; q < nx; ++q) {
          const int64_t pix = (b * height + py) * width + x0 + q;
          const int64_t last = lasts[pix];
          rlastk[q] = last < r.start ? -1 : (int32_t)(last - r.start);
          active += rlastk[q] >= 0;
          rTf[q] = 1.0f - A[pix];
          rT[q] = rTf[q];
          const float* v_out = vr + pix * C;
          float bg_dot = 0.0f;
          if (bg) for (int64_t c = 0; c < C; ++c) bg_dot += bg[b * C + c] * v_out[c];
          rbg[q] = bg_dot;
          rb1[q] = rb2[q] = 0.0f;
        }
        if (active == 0) continue;
        std::fill(rbuf.begin(), rbuf.begin() + nx * C, 0.0f);
        for (int64_t j = n_row - 1; j >= 0; --j) {
          const int64_t k = row[j];
          int64_t p0, p1;
          rows.px_range(k, x0, x1, p0, p1);
          if (p0 > p1) continue;
          const int64_t i = r.start + k;
          const int64_t g = fids[i];
          const float a_ = la[k], b_ = lb[k], c_ = lc[k], o = lo[k];
          const float z = dep[g];
          const float* f = feat + g * C;
          float* grow = isect_grad.data() + (size_t)i * S;
          for (int64_t px = p0; px <= p1; ++px) {
            const int64_t q = px - x0;
            if (k > rlastk[q]) continue;  // behind this pixel's last contributor (or inactive)
            const int64_t pix = (b * height + py) * width + px;
            const float fx = (float)px + 0.5f;
            const float dx = lx[k] - fx, dy = ly[k] - fy;
            float a, vis;
            if (!gauss_alpha(a_, b_, c_, o, dx, dy, a, vis)) continue;
            const float ra = 1.0f / (1.0f - a);
            rT[q] *= ra;  // transmittance in front of this Gaussian
            const float T = rT[q];
            const float w = a * T;
            const float* v_out = vr + pix * C;
            float* buf = rbuf.data() + q * C;
            float v_a = 0.0f;
#pragma omp simd reduction(+ : v_a)
            for (int64_t c = 0; c < C; ++c) {
              grow[7 + c] += w * v_out[c];
              v_a += (f[c] * T - buf[c] * ra) * v_out[c];
              buf[c] += f[c] * w;
            }
            const float v_D1 = vd1[pix], v_D2 = vd2[pix];
            v_a += (z * T - rb1[q] * ra) * v_D1 + (z * z * T - rb2[q] * ra) * v_D2;
            v_a += rTf[q] * ra * (va[pix] - rbg[q]);
            grow[6] += w * (v_D1 + 2.0f * z * v_D2);
            rb1[q] += z * w;
            rb2[q] += z * z * w;
            if (o * vis <= kAlphaMax) {
              const float v_sigma = -o * vis * v_a;
              grow[0] += v_sigma * (a_ * dx + b_ * dy);
              grow[1] += v_sigma * (b_ * dx + c_ * dy);
              grow[2] += 0.5f * v_sigma * dx * dx;
              grow[3] += v_sigma * dx * dy;
              grow[4] += 0.5f * v_sigma * dy * dy;
              grow[5] += vis * v_a;
            }
          }
        }
      }
    }
  }

  auto fopt = means2d.options();
  auto v_means2d = at::zeros({B, N, 2}, fopt);
  auto v_conics = at::zeros({B, N, 3}, fopt);
  auto v_features = at::zeros({B, N, C}, fopt);
  auto v_opacities = at::zeros({B, N}, fopt);
  auto v_depths = at::zeros({B, N}, fopt);
  float* gxy = v_means2d.data_ptr<float>();
  float* gcon = v_conics.data_ptr<float>();
  float* gfeat = v_features.data_ptr<float>();
  float* gop = v_opacities.data_ptr<float>();
  float* gdep = v_depths.data_ptr<float>();
  // Deterministic serial reduction of intersection rows into Gaussians.
  for (int64_t i = 0; i < n_isects; ++i) {
    const int64_t g = fids[i];
    const float* row = isect_grad.data() + (size_t)i * S;
    gxy[2 * g] += row[0]; gxy[2 * g + 1] += row[1];
    gcon[3 * g] += row[2]; gcon[3 * g + 1] += row[3]; gcon[3 * g + 2] += row[4];
    gop[g] += row[5];
    gdep[g] += row[6];
    float* gf = gfeat + g * C;
    for (int64_t c = 0; c < C; ++c) gf[c] += row[7 + c];
  }
  return {v_means2d, v_conics, v_features, v_opacities, v_depths};
}

}  // namespace

TORCH_LIBRARY_IMPL(rh3dgs, CPU, m) {
  m.impl("rasterize_fwd", &rasterize_fwd_cpu);
  m.impl("rasterize_bwd", &rasterize_bwd_cpu);
}

}  // namespace rh3dgs
