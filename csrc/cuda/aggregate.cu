// CUDA backend of aggregate_sphere (contract in csrc/ext.cpp; CPU twin in
// csrc/cpu/aggregate.cpp). One thread per pixel; per-Gaussian sums with atomics.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../common.h"

namespace rh3dgs {
namespace {

__global__ void aggregate_sphere_kernel(const float* __restrict__ xy, const float* __restrict__ con,
                                        const float* __restrict__ opac, const float* __restrict__ pf,
                                        const float* __restrict__ pw, const float* __restrict__ mu, float delta,
                                        int mode, int64_t B, int64_t NB, int64_t H, int64_t W, int64_t D,
                                        int64_t tile_size, int64_t TH, int64_t TW, const int32_t* __restrict__ offsets,
                                        const int32_t* __restrict__ fids, int64_t n_isects, float* __restrict__ acc_w,
                                        float* __restrict__ acc_v, float* __restrict__ acc_raw) {
  const int64_t b = blockIdx.z, ty = blockIdx.y, tx = blockIdx.x;
  const int64_t px = tx * tile_size + threadIdx.x, py = ty * tile_size + threadIdx.y;
  if (px >= W || py >= H) return;
  const int64_t flat = (b * TH + ty) * TW + tx;
  int64_t start, end;
  tile_bounds(offsets, flat, B * TH * TW, n_isects, start, end);
  const int64_t pix = (b * H + py) * W + px;
  const float pweight = pw[pix];
  if (!(pweight > 0.0f)) return;
  const float* z = pf + pix * D;
  const float fx = (float)px + 0.5f, fy = (float)py + 0.5f;
  float T = 1.0f;
  for (int64_t i = start; i < end; ++i) {
    const int64_t g = fids[i];
    const float dx = xy[2 * g] - fx, dy = xy[2 * g + 1] - fy;
    float a, vis;
    if (!gauss_alpha(con[3 * g], con[3 * g + 1], con[3 * g + 2], opac[g], dx, dy, a, vis)) continue;
    const float next_T = T * (1.0f - a);
    if (next_T <= kTransmittanceMin) break;
    const float w = a * T * pweight;
    T = next_T;
    const int64_t gi = g % NB;
    float* v = acc_v + gi * D;
    atomicAdd(acc_raw + gi, a * pweight);
    if (mode == 0) {
      atomicAdd(acc_w + gi, w);
      for (int64_t d = 0; d < D; ++d) atomicAdd(v + d, w * z[d]);
      continue;
    }
    const float* mi = mu + gi * D;
    float cosv = 0.0f;
    for (int64_t d = 0; d < D; ++d) cosv += mi[d] * z[d];
    cosv = fmaxf(-1.0f, fminf(1.0f, cosv));
    const float sinv = sqrtf(fmaxf(0.0f, 1.0f - cosv * cosv));  // |z| = |mu| = 1 (see the CPU twin)
    const float theta = atan2f(sinv, cosv);
    const float omega = (theta > delta) ? w * delta / theta : w;
    atomicAdd(acc_w + gi, omega);
    const float scale = (sinv > 1e-12f) ? omega * theta / sinv : omega;
    for (int64_t d = 0; d < D; ++d) atomicAdd(v + d, scale * (z[d] - cosv * mi[d]));
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> aggregate_sphere_cuda(
    const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& opacities, const at::Tensor& pixel_feats,
    const at::Tensor& pixel_weights, const at::Tensor& mu, double delta, int64_t mode, int64_t num_gaussians,
    int64_t tile_size, const at::Tensor& isect_offsets, const at::Tensor& flatten_ids) {
  TORCH_CHECK(num_gaussians == means2d.size(1), "num_gaussians must equal means2d.size(1)");
  const c10::cuda::CUDAGuard guard(means2d.device());
  const auto xy = means2d.contiguous(), con = conics.contiguous(), op = opacities.contiguous();
  const auto pf = pixel_feats.contiguous(), pw = pixel_weights.contiguous(), m = mu.contiguous();
  const auto offs = isect_offsets.contiguous(), fids = flatten_ids.contiguous();
  const int64_t B = xy.size(0), NB = xy.size(1), H = pf.size(1), W = pf.size(2), D = pf.size(3);
  const int64_t TH = offs.size(1), TW = offs.size(2);
  auto fopt = xy.options();
  auto acc_w = at::zeros({NB}, fopt), acc_v = at::zeros({NB, D}, fopt), acc_raw = at::zeros({NB}, fopt);
  const dim3 blocks(TW, TH, B), threads(tile_size, tile_size, 1);
  aggregate_sphere_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      xy.data_ptr<float>(), con.data_ptr<float>(), op.data_ptr<float>(), pf.data_ptr<float>(), pw.data_ptr<float>(),
      m.data_ptr<float>(), (float)delta, (int)mode, B, NB, H, W, D, tile_size, TH, TW, offs.data_ptr<int32_t>(),
      fids.data_ptr<int32_t>(), fids.numel(), acc_w.data_ptr<float>(), acc_v.data_ptr<float>(),
      acc_raw.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {acc_w, acc_v, acc_raw};
}

}  // namespace

TORCH_LIBRARY_IMPL(rh3dgs, CUDA, m) { m.impl("aggregate_sphere", &aggregate_sphere_cuda); }

}  // namespace rh3dgs
