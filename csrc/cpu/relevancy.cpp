// CPU backend of the per-pixel relevancy of rendered latents (the text-query fast path).
//
// For latents f [P, d] (rows of a rendered latent map), folded queries pos [Q, d] and
// negatives neg [J, d] (decoder^T phi), and R [r, d] with R^T R = decoder^T decoder:
//   cos_k = <q_k, f> / max(|R f|, 1e-12)
//   rel_q = sigmoid(tau (cos_q - max_j cos_j))      (sigmoid(tau cos_q) when J = 0)
// Sixteen pixels at a time, one SIMD lane per pixel: the [16, d] x [d, Q + J + r] product is
// d vector FMAs per output column (the latents stay in registers for the compiled counts of d),
// and the norm, maximum and sigmoid are lane-wise vector loops. The torch reference is
// SemanticField.cosine + relevancy_from_cosines (rh3dgs/ops/relevancy.py).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "dispatch.h"
#include "fastmath.h"
#include "vec16.h"

namespace rh3dgs {
namespace {

// sigmoid for any x: 1 / (1 + e^-x) and e^x / (1 + e^x) from one exp of -|x|, lane-wise on
// native vectors (an `omp simd` loop over exp_neg did not vectorise: see exp_neg_v).
inline vf16 sigmoid16(vf16 x) {
  alignas(64) float xs[16], out[16];
  store16(xs, x);
  for (int h = 0; h < 16; h += kNativeLanes) {
    const vfn v = loadn(xs + h);
    const vfn av = v < 0.0f ? -v : v;  // fabs
    const vfn e = exp_neg_v(-av);
    storen(out + h, v >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e));
  }
  return load16(out);
}

// 1 / max(sqrt(n2), 1e-12), lane-wise.
inline vf16 inv_norm16(vf16 n2) {
  alignas(64) float xs[16], out[16];
  store16(xs, n2);
  for (int h = 0; h < 16; h += kNativeLanes) {
    const vfn r = sqrtn(loadn(xs + h));
    storen(out + h, 1.0f / (r < 1e-12f ? splatn(1e-12f) : r));
  }
  return load16(out);
}

// CT = d when it is a compiled channel count (the block's [d] x 16 latents stay in registers and
// each output column is one chain of d vector FMAs), 0 for any d.
template <int CT>
void relevancy_blocks(const float* lat, int64_t ld, int64_t P, int64_t d_rt, const float* m, int64_t Q, int64_t J,
                      int64_t K, float tau, float* o) {
  const int64_t d = CT > 0 ? CT : d_rt;
  at::parallel_for(0, (P + 15) / 16, 256, [&](int64_t b0, int64_t b1) {
    std::vector<vf16> ft_buf(CT > 0 ? 0 : d), y(K);
    vf16 ft_fixed[CT > 0 ? CT : 1];
    vf16* ft = CT > 0 ? ft_fixed : ft_buf.data();  // ft[c]: channel c of the block's 16 pixels
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t p0 = blk * 16, n = std::min<int64_t>(16, P - p0);
      for (int64_t c = 0; c < d; ++c) ft[c] = vf16{};
      for (int64_t l = 0; l < n; ++l) {
        const float* f = lat + (p0 + l) * ld;
        for (int64_t c = 0; c < d; ++c) ft[c][l] = f[c];
      }
      for (int64_t k = 0; k < K; ++k) {  // y[k] = sum_c M[k, c] ft[c], in channel order
        const float* mk = m + k * d;
        vf16 acc = mk[0] * ft[0];
        for (int64_t c = 1; c < d; ++c) acc += mk[c] * ft[c];
        y[k] = acc;
      }
      vf16 norm2{};
      for (int64_t k = Q + J; k < K; ++k) norm2 += y[k] * y[k];
      const vf16 inv = inv_norm16(norm2);
      vf16 neg_max = splat16(0.0f);
      if (J > 0) {
        neg_max = y[Q] * inv;
        for (int64_t j = 1; j < J; ++j) {
          const vf16 cj = y[Q + j] * inv;
          neg_max = cj > neg_max ? cj : neg_max;
        }
      }
      for (int64_t q = 0; q < Q; ++q) {
        const vf16 rel = sigmoid16(tau * (y[q] * inv - neg_max));
        for (int64_t l = 0; l < n; ++l) o[(p0 + l) * Q + q] = rel[l];
      }
    }
  });
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
  const int64_t Q = pos_.size(0), J = neg_.size(0), r = norm_factor_.size(0), K = Q + J + r;
  // M [K, d]: the rows of the product (queries, negatives, R)
  const auto M = at::cat({pos_, neg_, norm_factor_}, 0).contiguous();
  auto out = at::empty({P, Q}, latents.options());
  if (P == 0) return out;
  if (d == 0) return out.fill_(0.5f);  // zero latents: every cosine is 0
  dispatch_channels(d, [&](auto ct) {
    relevancy_blocks<decltype(ct)::value>(latents.data_ptr<float>(), latents.stride(0), P, d, M.data_ptr<float>(), Q,
                                          J, K, (float)temperature, out.data_ptr<float>());
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(rh3dgs, CPU, m) { m.impl("relevancy", &relevancy_cpu); }

}  // namespace rh3dgs
