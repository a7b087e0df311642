// CUDA backend of the rh3dgs rasterization core (same contract and rules as
// csrc/cpu/rasterize.cpp; see csrc/common.h). One thread per pixel, one block per tile.
// Gradients are accumulated with atomics (not bit-deterministic; see docs/reliability.md).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../common.h"

namespace rh3dgs {
namespace {

__global__ void rasterize_fwd_kernel(const float* __restrict__ xy, const float* __restrict__ con,
                                     const float* __restrict__ feat, const float* __restrict__ opac,
                                     const float* __restrict__ dep, const float* __restrict__ bg, int64_t B, int64_t C,
                                     int64_t width, int64_t height, int64_t tile_size, int64_t TH, int64_t TW,
                                     const int32_t* __restrict__ offsets, const int32_t* __restrict__ fids,
                                     int64_t n_isects, float* __restrict__ out, float* __restrict__ out_a,
                                     float* __restrict__ out_d1, float* __restrict__ out_d2, int32_t* __restrict__ out_last) {
  const int64_t b = blockIdx.z, ty = blockIdx.y, tx = blockIdx.x;
  const int64_t px = tx * tile_size + threadIdx.x, py = ty * tile_size + threadIdx.y;
  if (px >= width || py >= height) return;
  int64_t start, end;
  tile_bounds(offsets, (b * TH + ty) * TW + tx, B * TH * TW, n_isects, start, end);
  const float fx = (float)px + 0.5f, fy = (float)py + 0.5f;
  const int64_t pix = (b * height + py) * width + px;
  float* o = out + pix * C;
  for (int64_t c = 0; c < C; ++c) o[c] = 0.0f;
  float T = 1.0f, sd1 = 0.0f, sd2 = 0.0f;
  int32_t last = -1;
  for (int64_t i = start; i < end; ++i) {
    const int64_t g = fids[i];
    const float dx = xy[2 * g] - fx, dy = xy[2 * g + 1] - fy;
    float a, vis;
    if (!gauss_alpha(con[3 * g], con[3 * g + 1], con[3 * g + 2], opac[g], dx, dy, a, vis)) continue;
    const float next_T = T * (1.0f - a);
    if (next_T <= kTransmittanceMin) break;
    const float w = a * T;
    const float* f = feat + g * C;
    for (int64_t c = 0; c < C; ++c) o[c] += w * f[c];
    sd1 += w * dep[g];
    sd2 += w * dep[g] * dep[g];
    T = next_T;
    last = (int32_t)i;
  }
  if (bg) for (int64_t c = 0; c < C; ++c) o[c] += T * bg[b * C + c];
  out_a[pix] = 1.0f - T;
  out_d1[pix] = sd1;
  out_d2[pix] = sd2;
  out_last[pix] = last;
}

__global__ void rasterize_bwd_kernel(const float* __restrict__ xy, const float* __restrict__ con,
                                     const float* __restrict__ feat, const float* __restrict__ opac,
                                     const float* __restrict__ dep, const float* __restrict__ bg, int64_t B, int64_t C,
                                     int64_t CG, int64_t width, int64_t height, int64_t tile_size, int64_t TH,
                                     int64_t TW,
                                     const int32_t* __restrict__ offsets, const int32_t* __restrict__ fids,
                                     int64_t n_isects, const float* __restrict__ A, const int32_t* __restrict__ lasts,
                                     const float* __restrict__ vr, const float* __restrict__ va,
                                     const float* __restrict__ vd1, const float* __restrict__ vd2,
                                     float* __restrict__ scratch, float* __restrict__ gxy, float* __restrict__ gcon,
                                     float* __restrict__ gfeat, float* __restrict__ gop, float* __restrict__ gdep) {
  const int64_t b = blockIdx.z, ty = blockIdx.y, tx = blockIdx.x;
  const int64_t px = tx * tile_size + threadIdx.x, py = ty * tile_size + threadIdx.y;
  if (px >= width || py >= height) return;
  int64_t start, end;
  tile_bounds(offsets, (b * TH + ty) * TW + tx, B * TH * TW, n_isects, start, end);
  const int64_t pix = (b * height + py) * width + px;
  const int64_t last = lasts[pix];
  if (last < start) return;
  const float fx = (float)px + 0.5f, fy = (float)py + 0.5f;
  const float T_final = 1.0f - A[pix];
  float T = T_final;
  const float* v_out = vr + pix * C;
  float* buf = scratch + pix * C;  // zero-initialised by the host
  const float v_A = va[pix], v_D1 = vd1[pix], v_D2 = vd2[pix];
  float bg_dot = 0.0f;
  if (bg) for (int64_t c = 0; c < CG; ++c) bg_dot += bg[b * C + c] * v_out[c];  // channels >= CG: no geometry
  float buf_d1 = 0.0f, buf_d2 = 0.0f;
  for (int64_t i = last; i >= start; --i) {
    const int64_t g = fids[i];
    const float a_ = con[3 * g], b_ = con[3 * g + 1], c_ = con[3 * g + 2];
    const float dx = xy[2 * g] - fx, dy = xy[2 * g + 1] - fy;
    const float o = opac[g];
    float a, vis;
    if (!gauss_alpha(a_, b_, c_, o, dx, dy, a, vis)) continue;
    const float ra = 1.0f / (1.0f - a);
    T *= ra;
    const float w = a * T;
    const float z = dep[g];
    const float* f = feat + g * C;
    float v_a = 0.0f;
    for (int64_t c = 0; c < C; ++c) {
      atomicAdd(gfeat + g * C + c, w * v_out[c]);
      if (c < CG) {
        v_a += (f[c] * T - buf[c] * ra) * v_out[c];
        buf[c] += f[c] * w;
      }
    }
    v_a += (z * T - buf_d1 * ra) * v_D1 + (z * z * T - buf_d2 * ra) * v_D2;
    v_a += T_final * ra * (v_A - bg_dot);
    atomicAdd(gdep + g, w * (v_D1 + 2.0f * z * v_D2));
    buf_d1 += z * w;
    buf_d2 += z * z * w;
    if (o * vis <= kAlphaMax) {
      const float v_sigma = -o * vis * v_a;
      atomicAdd(gxy + 2 * g, v_sigma * (a_ * dx + b_ * dy));
      atomicAdd(gxy + 2 * g + 1, v_sigma * (b_ * dx + c_ * dy));
      atomicAdd(gcon + 3 * g, 0.5f * v_sigma * dx * dx);
      atomicAdd(gcon + 3 * g + 1, v_sigma * dx * dy);
      atomicAdd(gcon + 3 * g + 2, 0.5f * v_sigma * dy * dy);
      atomicAdd(gop + g, vis * v_a);
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rasterize_fwd_cuda(
    const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& features_, const at::Tensor& opacities,
    const at::Tensor& depths, const c10::optional<at::Tensor>& backgrounds_, int64_t width, int64_t height,
    int64_t tile_size, const at::Tensor& isect_offsets, const at::Tensor& flatten_ids) {
  const c10::cuda::CUDAGuard guard(means2d.device());
  const auto xy = means2d.contiguous(), con = conics.contiguous(), feat = features_.contiguous();
  const auto op = opacities.contiguous(), dep = depths.contiguous();
  const auto offs = isect_offsets.contiguous(), fids = flatten_ids.contiguous();
  at::Tensor bg;
  if (backgrounds_.has_value()) bg = backgrounds_->contiguous();
  const int64_t B = xy.size(0), C = feat.size(2), TH = offs.size(1), TW = offs.size(2);
  auto fopt = xy.options();
  auto render = at::empty({B, height, width, C}, fopt);
  auto alpha = at::empty({B, height, width}, fopt);
  auto d1 = at::empty({B, height, width}, fopt);
  auto d2 = at::empty({B, height, width}, fopt);
  auto last = at::empty({B, height, width}, fopt.dtype(at::kInt));
  const dim3 blocks(TW, TH, B), threads(tile_size, tile_size, 1);
  rasterize_fwd_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      xy.data_ptr<float>(), con.data_ptr<float>(), feat.data_ptr<float>(), op.data_ptr<float>(), dep.data_ptr<float>(),
      bg.defined() ? bg.data_ptr<float>() : nullptr, B, C, width, height, tile_size, TH, TW, offs.data_ptr<int32_t>(),
      fids.data_ptr<int32_t>(), fids.numel(), render.data_ptr<float>(), alpha.data_ptr<float>(), d1.data_ptr<float>(),
      d2.data_ptr<float>(), last.data_ptr<int32_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {render, alpha, d1, d2, last};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rasterize_bwd_cuda(
    const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& features_, const at::Tensor& opacities,
    const at::Tensor& depths, const c10::optional<at::Tensor>& backgrounds_, int64_t width, int64_t height,
    int64_t tile_size, const at::Tensor& isect_offsets, const at::Tensor& flatten_ids, const at::Tensor& alpha,
    const at::Tensor& last_ids, const at::Tensor& v_render, const at::Tensor& v_alpha, const at::Tensor& v_d1,
    const at::Tensor& v_d2, int64_t geometry_channels) {
  const c10::cuda::CUDAGuard guard(means2d.device());
  const auto xy = means2d.contiguous(), con = conics.contiguous(), feat = features_.contiguous();
  const auto op = opacities.contiguous(), dep = depths.contiguous();
  const auto offs = isect_offsets.contiguous(), fids = flatten_ids.contiguous();
  at::Tensor bg;
  if (backgrounds_.has_value()) bg = backgrounds_->contiguous();
  const int64_t B = xy.size(0), N = xy.size(1), C = feat.size(2), TH = offs.size(1), TW = offs.size(2);
  const int64_t CG = geometry_channels < 0 ? C : std::min<int64_t>(geometry_channels, C);
  auto fopt = xy.options();
  auto gxy = at::zeros({B, N, 2}, fopt), gcon = at::zeros({B, N, 3}, fopt), gfeat = at::zeros({B, N, C}, fopt);
  auto gop = at::zeros({B, N}, fopt), gdep = at::zeros({B, N}, fopt);
  auto scratch = at::zeros({B, height, width, C}, fopt);
  const auto A = alpha.contiguous(), L = last_ids.contiguous(), vr = v_render.contiguous();
  const auto va = v_alpha.contiguous(), vd1 = v_d1.contiguous(), vd2 = v_d2.contiguous();
  const dim3 blocks(TW, TH, B), threads(tile_size, tile_size, 1);
  rasterize_bwd_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      xy.data_ptr<float>(), con.data_ptr<float>(), feat.data_ptr<float>(), op.data_ptr<float>(), dep.data_ptr<float>(),
      bg.defined() ? bg.data_ptr<float>() : nullptr, B, C, CG, width, height, tile_size, TH, TW,
      offs.data_ptr<int32_t>(),
      fids.data_ptr<int32_t>(), fids.numel(), A.data_ptr<float>(), L.data_ptr<int32_t>(), vr.data_ptr<float>(),
      va.data_ptr<float>(), vd1.data_ptr<float>(), vd2.data_ptr<float>(), scratch.data_ptr<float>(),
      gxy.data_ptr<float>(), gcon.data_ptr<float>(), gfeat.data_ptr<float>(), gop.data_ptr<float>(),
      gdep.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {gxy, gcon, gfeat, gop, gdep};
}

}  // namespace

TORCH_LIBRARY_IMPL(rh3dgs, CUDA, m) {
  m.impl("rasterize_fwd", &rasterize_fwd_cuda);
  m.impl("rasterize_bwd", &rasterize_bwd_cuda);
}

}  // namespace rh3dgs
