// CUDA backend of the LIC multi-positive InfoNCE (contract in csrc/ext.cpp; CPU twin in
// csrc/cpu/lic.cpp, whose comment explains the local derivatives d_sim and d_anchor).
// Forward: one thread per anchor, an online logsumexp over its candidates, then a second pass
// over them for the local derivatives. Backward: one thread per anchor scatters dL/df with
// atomics (not bit-deterministic, unlike the CPU kernel), then one thread per row maps dL/df to
// dL/dx through F.normalize. Indices are checked by the Python entry (rh3dgs.ops.lic_infonce).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

namespace rh3dgs {
namespace {

constexpr float kNormEps = 1e-12f;
constexpr int kThreads = 128;

__device__ __forceinline__ float dot(const float* __restrict__ u, const float* __restrict__ v, int64_t d) {
  float s = 0.0f;
  for (int64_t c = 0; c < d; ++c) s += u[c] * v[c];
  return s;
}

__device__ __forceinline__ float inv_norm(const float* __restrict__ x, int64_t d) {
  return 1.0f / fmaxf(sqrtf(dot(x, x, d)), kNormEps);
}

__global__ void lic_fwd_kernel(const float* __restrict__ x, const int64_t* __restrict__ an,
                               const int64_t* __restrict__ cj, const uint8_t* __restrict__ kd, int64_t A, int64_t K,
                               int64_t d, float inv_tau, float* __restrict__ loss, float* __restrict__ fa,
                               float* __restrict__ dfa, float* __restrict__ ds) {
  const int64_t a = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (a >= A) return;
  const float* xa = x + an[a] * d;
  const float ia = inv_norm(xa, d);
  float* fa_a = fa + a * d;
  float* dfa_a = dfa + a * d;
  for (int64_t c = 0; c < d; ++c) {
    fa_a[c] = xa[c] * ia;
    dfa_a[c] = 0.0f;
  }
  const int64_t* ca = cj + a * K;
  const uint8_t* ka = kd + a * K;
  float smax = -INFINITY, sum = 0.0f, spos = 0.0f;
  int64_t npos = 0;
  for (int64_t k = 0; k < K; ++k) {
    if (ka[k] == 0) continue;
    const float* xj = x + ca[k] * d;
    const float s = dot(fa_a, xj, d) * inv_norm(xj, d) * inv_tau;
    if (s > smax) {
      sum = sum * expf(smax - s) + 1.0f;
      smax = s;
    } else {
      sum += expf(s - smax);
    }
    if (ka[k] == 2) {
      spos += s;
      ++npos;
    }
  }
  const float lse = smax + logf(sum);
  loss[a] = npos > 0 ? lse - spos / (float)npos : 0.0f;
  const float inv_npos = npos > 0 ? 1.0f / (float)npos : 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    ds[a * K + k] = 0.0f;
    if (ka[k] == 0 || npos == 0) continue;
    const float* xj = x + ca[k] * d;
    const float ij = inv_norm(xj, d);
    const float s = dot(fa_a, xj, d) * ij * inv_tau;
    const float dsk = (expf(fminf(s - lse, 0.0f)) - (ka[k] == 2 ? inv_npos : 0.0f)) * inv_tau;
    ds[a * K + k] = dsk;
    for (int64_t c = 0; c < d; ++c) dfa_a[c] += dsk * ij * xj[c];
  }
}

__global__ void lic_scatter_kernel(const int64_t* __restrict__ an, const int64_t* __restrict__ cj,
                                   const uint8_t* __restrict__ kd, const float* __restrict__ fa,
                                   const float* __restrict__ dfa, const float* __restrict__ ds,
                                   const float* __restrict__ g, int64_t A, int64_t K, int64_t d,
                                   float* __restrict__ gf) {
  const int64_t a = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (a >= A || g[a] == 0.0f) return;
  const float* fa_a = fa + a * d;
  for (int64_t k = 0; k < K; ++k) {
    const float w = g[a] * ds[a * K + k];
    if (kd[a * K + k] == 0 || w == 0.0f) continue;
    float* gj = gf + cj[a * K + k] * d;
    for (int64_t c = 0; c < d; ++c) atomicAdd(gj + c, w * fa_a[c]);
  }
  float* ga = gf + an[a] * d;
  for (int64_t c = 0; c < d; ++c) atomicAdd(ga + c, g[a] * dfa[a * d + c]);
}

__global__ void normalize_bwd_kernel(const float* __restrict__ x, int64_t N, int64_t d, float* __restrict__ g) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= N) return;
  const float* xi = x + i * d;
  float* gi = g + i * d;
  const float ix = inv_norm(xi, d);
  const float proj = ix < 1.0f / kNormEps ? dot(xi, gi, d) * ix * ix : 0.0f;
  for (int64_t c = 0; c < d; ++c) gi[c] = (gi[c] - xi[c] * proj) * ix;
}

inline unsigned blocks_for(int64_t n) { return (unsigned)((n + kThreads - 1) / kThreads); }

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> lic_infonce_fwd_cuda(const at::Tensor& features,
                                                                                const at::Tensor& anchors,
                                                                                const at::Tensor& candidates,
                                                                                const at::Tensor& kinds,
                                                                                double inv_temperature) {
  const c10::cuda::CUDAGuard guard(features.device());
  const auto x = features.contiguous(), an = anchors.contiguous(), cj = candidates.contiguous();
  const auto kd = kinds.contiguous();
  const int64_t A = cj.size(0), K = cj.size(1), d = x.size(1);
  auto loss = at::empty({A}, x.options()), fa = at::empty({A, d}, x.options());
  auto dfa = at::empty({A, d}, x.options()), ds = at::empty({A, K}, x.options());
  if (A == 0) return {loss, fa, dfa, ds};
  lic_fwd_kernel<<<blocks_for(A), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), an.data_ptr<int64_t>(), cj.data_ptr<int64_t>(), kd.data_ptr<uint8_t>(), A, K, d,
      (float)inv_temperature, loss.data_ptr<float>(), fa.data_ptr<float>(), dfa.data_ptr<float>(),
      ds.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {loss, fa, dfa, ds};
}

at::Tensor lic_infonce_bwd_cuda(const at::Tensor& features, const at::Tensor& anchors, const at::Tensor& candidates,
                                const at::Tensor& kinds, const at::Tensor& anchor_feats, const at::Tensor& d_anchor,
                                const at::Tensor& d_sim, const at::Tensor& grad_loss) {
  const c10::cuda::CUDAGuard guard(features.device());
  const auto x = features.contiguous(), an = anchors.contiguous(), cj = candidates.contiguous();
  const auto kd = kinds.contiguous(), fa = anchor_feats.contiguous(), dfa = d_anchor.contiguous();
  const auto ds = d_sim.contiguous(), gl = grad_loss.contiguous();
  const int64_t N = x.size(0), A = cj.size(0), K = cj.size(1), d = x.size(1);
  auto gx = at::zeros_like(x);
  if (A == 0 || N == 0) return gx;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  lic_scatter_kernel<<<blocks_for(A), kThreads, 0, stream>>>(
      an.data_ptr<int64_t>(), cj.data_ptr<int64_t>(), kd.data_ptr<uint8_t>(), fa.data_ptr<float>(),
      dfa.data_ptr<float>(), ds.data_ptr<float>(), gl.data_ptr<float>(), A, K, d, gx.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  normalize_bwd_kernel<<<blocks_for(N), kThreads, 0, stream>>>(x.data_ptr<float>(), N, d, gx.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return gx;
}

}  // namespace

TORCH_LIBRARY_IMPL(rh3dgs, CUDA, m) {
  m.impl("lic_infonce_fwd", &lic_infonce_fwd_cuda);
  m.impl("lic_infonce_bwd", &lic_infonce_bwd_cuda);
}

}  // namespace rh3dgs
