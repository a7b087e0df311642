// CPU backend of the per-pixel relevancy of rendered latents (the text-query fast path).
//
// For latents f [P, d] (rows of a rendered latent map), folded queries pos [Q, d] and
// negatives neg [J, d] (decoder^T phi), and R [r, d] with R^T R = decoder^T decoder:
//   cos_k = <q_k, f> / max(|R f|, 1e-12)
//   rel_q = sigmoid(tau (cos_q - max_j cos_j))      (sigmoid(tau cos_q) when J = 0)
// Sixteen pixels at a time, one SIMD lane per pixel: the [16, d] x [d, Q + J + r] product is
// d vector FMAs per output column, and the norm, maximum and sigmoid are lane-wise. The
// torch reference is SemanticField.cosine + relevancy_from_cosines (rh3dgs/ops/relevancy.py).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "fastmath.h"
#include "vec16.h"

namespace rh3dgs {
namespace {

// sigmoid for any x: 1 / (1 + e^-x) and e^x / (1 + e^x) from one exp of -|x|.
inline vf16 sigmoid16(vf16 x) {
  vf16 out;
  for (int l = 0; l < 16; ++l) {
    const float e = exp_neg(-std::fabs(x[l]));
    out[l] = x[l] >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
  }
  return out;
}

at::Tensor relevancy_cpu(const at::Tensor& latents_, const at::Tensor& pos_, const at::Tensor& neg_,
                         const at::Tensor& norm_factor_, double temperature) {
  TORCH_CHECK(latents_.dim() == 2, "latents must be [P, d]");
  const int64_t P = latents_.size(0), d = latents_.size(1);
  TORCH_CHECK(pos_.dim() == 2 && pos_.size(1) == d, "pos must be [Q, d]");
  TORCH_CHECK(neg_.dim() == 2 && neg_.size(1) == d, "neg must be [J, d]");
  TORCH_CHECK(norm_factor_.dim() == 2 && norm_factor_.size(1) == d, "norm_factor must be [r, d]");
  for (const auto* t : {&latents_, &pos_, &neg_, &norm_factor_}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat, "relevancy expects float32 tensors");
  }
  // rows may be strided (a slice of an RGB + latent render): only unit channel stride is needed
  const auto latents = latents_.stride(1) == 1 ? latents_ : latents_.contiguous();
  const int64_t ld = latents.stride(0);
  const int64_t Q = pos_.size(0), J = neg_.size(0), r = norm_factor_.size(0), K = Q + J + r;
  // M [d, K]: the columns of the product (queries, negatives, R)
  const auto M = at::cat({pos_, neg_, norm_factor_}, 0).t().contiguous();
  auto out = at::empty({P, Q}, latents.options());
  const float* lat = latents.data_ptr<float>();
  const float* m = M.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const float tau = (float)temperature;

  at::parallel_for(0, (P + 15) / 16, 256, [&](int64_t b0, int64_t b1) {
    std::vector<vf16> ft(d), y(K);  // ft[c]: channel c of the block's 16 pixels
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t p0 = blk * 16, n = std::min<int64_t>(16, P - p0);
      for (int64_t c = 0; c < d; ++c) ft[c] = vf16{};
      for (int64_t l = 0; l < n; ++l) {
        const float* f = lat + (p0 + l) * ld;
        for (int64_t c = 0; c < d; ++c) ft[c][l] = f[c];
      }
      for (int64_t k = 0; k < K; ++k) y[k] = vf16{};
      for (int64_t c = 0; c < d; ++c) {
        const float* mc = m + c * K;
        for (int64_t k = 0; k < K; ++k) y[k] += mc[k] * ft[c];
      }
      vf16 norm2{};
      for (int64_t k = Q + J; k < K; ++k) norm2 += y[k] * y[k];
      vf16 inv;
      for (int l = 0; l < 16; ++l) inv[l] = 1.0f / std::max(std::sqrt(norm2[l]), 1e-12f);
      vf16 neg_max = splat16(0.0f);
      if (J > 0) {
        neg_max = y[Q] * inv;
        for (int64_t j = 1; j < J; ++j) {
          const vf16 cj = y[Q + j] * inv;
          for (int l = 0; l < 16; ++l) neg_max[l] = std::max(neg_max[l], cj[l]);
        }
      }
      for (int64_t q = 0; q < Q; ++q) {
        const vf16 rel = sigmoid16(tau * (y[q] * inv - neg_max));
        for (int64_t l = 0; l < n; ++l) o[(p0 + l) * Q + q] = rel[l];
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(rh3dgs, CPU, m) { m.impl("relevancy", &relevancy_cpu); }

}  // namespace rh3dgs
