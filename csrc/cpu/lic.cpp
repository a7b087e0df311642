// CPU backend of the LIC multi-positive InfoNCE and of LIC's pull form (contracts in csrc/ext.cpp; CUDA twin
// of the InfoNCE in csrc/cuda/lic.cu; torch references rh3dgs.ops._ref._ref_lic_infonce / _ref_lic_pull).
//
// The pull form, loss_a = 1 - mean_{kind = 2} <f_a, f_j>, has the same local derivatives
// (d_sim = -1 / |P| on positives, 0 elsewhere; d_anchor = sum_k d_sim f_j = -mean of the positives),
// so both forms share one backward, lic_infonce_bwd. Its forward reads only the positives' rows.
//
// For anchor a with candidates j = cand[a, k] of kind 1 (negative) or 2 (positive), kind 0 ignored:
//   f = x / max(|x|, 1e-12)  (F.normalize),  s_aj = <f_a, f_j> / tau
//   lse_a = log sum_{kind > 0} exp(s_aj),  loss_a = lse_a - mean_{kind = 2} s_aj  (0 without positives)
// Only the rows an anchor touches are read, once, by the forward (anchors in parallel; each writes
// only its own outputs). While a candidate row is still in L1 it also computes the local
// derivatives: d_sim[a, k] = dloss_a / d<f_a, f_j> = (softmax_k - [positive] / |P|) / tau and
// d_anchor[a] = sum_k d_sim[a, k] f_j. The backward then never reads a candidate row: it adds
// g_a d_sim[a, k] f_a to dL/df_j and g_a d_anchor[a] to dL/df_a in a [N, d] buffer, then maps
// dL/df to dL/dx through F.normalize row by row. Threads own ranges of rows, each scanning the
// contributions in (anchor, candidate) order: the sums are bit-identical for any thread count.
// Candidate rows are prefetched a few iterations ahead (random rows of an [N, d] table are the
// cost once N d no longer fits in L2).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dispatch.h"
#include "fastmath.h"
#include "reduce.h"  // dot<CT>
#include "vec16.h"

namespace rh3dgs {
namespace {

constexpr float kNormEps = 1e-12f;
constexpr int64_t kPrefetch = 8;  // candidates ahead

// 1 / max(|x|, eps): the scale of F.normalize.
inline float inv_norm_of(float norm2) { return 1.0f / std::max(std::sqrt(norm2), kNormEps); }

void check_inputs(const char* op, const at::Tensor& x, const at::Tensor& anchors, const at::Tensor& cand,
                  const at::Tensor& kinds) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              op, ": features must be a contiguous float32 [N, d]");
  TORCH_CHECK(anchors.dim() == 1 && anchors.scalar_type() == at::kLong && anchors.is_contiguous(),
              op, ": anchors must be a contiguous int64 [A]");
  TORCH_CHECK(cand.dim() == 2 && cand.size(0) == anchors.size(0) && cand.scalar_type() == at::kLong &&
                  cand.is_contiguous(),
              op, ": candidates must be a contiguous int64 [A, K]");
  TORCH_CHECK(kinds.sizes() == cand.sizes() && kinds.scalar_type() == at::kByte && kinds.is_contiguous(),
              op, ": kinds must be a contiguous uint8 [A, K]");
  const int64_t N = x.size(0), A = cand.size(0), K = cand.size(1);
  const int64_t* an = anchors.data_ptr<int64_t>();
  const int64_t* cj = cand.data_ptr<int64_t>();
  const uint8_t* kd = kinds.data_ptr<uint8_t>();
  // bitwise (no branch per element): an unsigned compare is 0 <= i < N
  bool ok = true;
  for (int64_t a = 0; a < A; ++a) ok &= (uint64_t)an[a] < (uint64_t)N;
  for (int64_t i = 0; i < A * K; ++i) ok &= (kd[i] <= 2) & ((kd[i] == 0) | ((uint64_t)cj[i] < (uint64_t)N));
  TORCH_CHECK(ok, op, ": an anchor or a used candidate is outside [0, ", N, ") or a kind is not 0, 1, 2");
}

template <int CT>
void lic_fwd_impl(const float* x, const int64_t* an, const int64_t* cj, const uint8_t* kd, int64_t A, int64_t K,
                  int64_t d_rt, float inv_tau, float* loss, float* fa_out, float* dfa_out, float* ds_out) {
  const int64_t d = CT > 0 ? CT : d_rt;
  at::parallel_for(0, A, 16, [&](int64_t a0, int64_t a1) {
    std::vector<float> tmp(d), s(K), ij(K);
    for (int64_t a = a0; a < a1; ++a) {
      const int64_t* ca = cj + a * K;
      const uint8_t* ka = kd + a * K;
      for (int64_t k = 0; k < std::min(K, kPrefetch); ++k) {
        if (ka[k] != 0) __builtin_prefetch(x + ca[k] * d);
      }
      const float* xa = x + an[a] * d;
      float* fa = fa_out + a * d;
      const float ia = inv_norm_of(dot<CT>(xa, xa, tmp.data(), d));
      for (int64_t c = 0; c < d; ++c) fa[c] = xa[c] * ia;
      float smax = -std::numeric_limits<float>::infinity(), spos = 0.0f;
      int64_t npos = 0;
      for (int64_t k = 0; k < K; ++k) {
        if (k + kPrefetch < K && ka[k + kPrefetch] != 0) __builtin_prefetch(x + ca[k + kPrefetch] * d);
        if (ka[k] == 0) continue;
        const float* xj = x + ca[k] * d;
        ij[k] = inv_norm_of(dot<CT>(xj, xj, tmp.data(), d));
        s[k] = dot<CT>(fa, xj, tmp.data(), d) * ij[k] * inv_tau;
        smax = std::max(smax, s[k]);
        if (ka[k] == 2) {
          spos += s[k];
          ++npos;
        }
      }
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        if (ka[k] != 0) sum += exp_neg(s[k] - smax);
      }
      const float lse = smax + std::log(sum);
      loss[a] = npos > 0 ? lse - spos / (float)npos : 0.0f;
      // local derivatives (the candidate rows are in L1 now)
      float* dfa = dfa_out + a * d;
      float* ds = ds_out + a * K;
      std::fill(dfa, dfa + d, 0.0f);
      const float inv_npos = npos > 0 ? 1.0f / (float)npos : 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        ds[k] = 0.0f;
        if (ka[k] == 0 || npos == 0) continue;
        ds[k] = (exp_neg(std::min(s[k] - lse, 0.0f)) - (ka[k] == 2 ? inv_npos : 0.0f)) * inv_tau;
        axpy<CT>(dfa, ds[k] * ij[k], x + ca[k] * d, d);  // + d_sim f_j
      }
    }
  });
}

// The pull form: per anchor m = sum over its positives of f_j (each row scaled by 1 / |x_j| as it is added), then
// loss = 1 - <f_a, m> / |P|, d_anchor = -m / |P|, d_sim = -1 / |P| on the positives (0 elsewhere). One pass over
// the positives' rows, one norm each; kinds 0 and 1 are never read.
template <int CT>
void lic_pull_fwd_impl(const float* x, const int64_t* an, const int64_t* cj, const uint8_t* kd, int64_t A, int64_t K,
                       int64_t d_rt, float* loss, float* fa_out, float* dfa_out, float* ds_out) {
  const int64_t d = CT > 0 ? CT : d_rt;
  at::parallel_for(0, A, 64, [&](int64_t a0, int64_t a1) {
    std::vector<float> tmp(d), m(d);
    std::vector<int64_t> rows(K);
    for (int64_t a = a0; a < a1; ++a) {
      const int64_t* ca = cj + a * K;
      const uint8_t* ka = kd + a * K;
      // the positives' rows, in candidate order: listed without a branch per candidate (a random kind
      // mispredicted about every other one), then read with prefetches a few rows ahead
      int64_t npos = 0;
      for (int64_t k = 0; k < K; ++k) {
        rows[npos] = ca[k];
        npos += ka[k] == 2;
      }
      for (int64_t i = 0; i < std::min(npos, kPrefetch); ++i) __builtin_prefetch(x + rows[i] * d);
      std::fill(m.begin(), m.end(), 0.0f);
      for (int64_t i = 0; i < npos; ++i) {
        if (i + kPrefetch < npos) __builtin_prefetch(x + rows[i + kPrefetch] * d);
        const float* xj = x + rows[i] * d;
        axpy<CT>(m.data(), inv_norm_of(dot<CT>(xj, xj, tmp.data(), d)), xj, d);
      }
      const float* xa = x + an[a] * d;
      float* fa = fa_out + a * d;
      const float ia = inv_norm_of(dot<CT>(xa, xa, tmp.data(), d));
      for (int64_t c = 0; c < d; ++c) fa[c] = xa[c] * ia;
      const float inv_npos = npos > 0 ? 1.0f / (float)npos : 0.0f;
      loss[a] = npos > 0 ? 1.0f - dot<CT>(fa, m.data(), tmp.data(), d) * inv_npos : 0.0f;
      float* dfa = dfa_out + a * d;
      for (int64_t c = 0; c < d; ++c) dfa[c] = -m[c] * inv_npos;
      float* ds = ds_out + a * K;
      for (int64_t k = 0; k < K; ++k) ds[k] = ka[k] == 2 ? -inv_npos : 0.0f;
    }
  });
}

template <int CT>
void lic_bwd_impl(const float* x, const int64_t* an, const int64_t* cj, const uint8_t* kd, const float* fa,
                  const float* dfa, const float* ds, const float* g, int64_t N, int64_t A, int64_t K, int64_t d_rt,
                  float* gx) {
  const int64_t d = CT > 0 ? CT : d_rt;
  // 1. dL/df into gx: threads own row ranges [r0, r1) and scan every contribution in order
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), N / 1024));
  at::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    std::vector<int64_t> used(K);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t r0 = N * p / parts, r1 = N * (p + 1) / parts;
      const uint64_t span = (uint64_t)(r1 - r0);
      for (int64_t a = 0; a < A; ++a) {
        if (g[a] == 0.0f) continue;
        const int64_t* ca = cj + a * K;
        const uint8_t* ka = kd + a * K;
        const float* ds_a = ds + a * K;
        const float* fa_a = fa + a * d;
        // the candidates this part adds to (used, in this part's rows, d_sim != 0), in candidate order,
        // listed without a branch per candidate (random kinds and rows mispredicted about every other one)
        int64_t n = 0;
        for (int64_t k = 0; k < K; ++k) {
          used[n] = k;
          n += (ka[k] != 0) & ((uint64_t)(ca[k] - r0) < span) & (ds_a[k] != 0.0f);
        }
        for (int64_t i = 0; i < std::min(n, kPrefetch); ++i) __builtin_prefetch(gx + ca[used[i]] * d, 1);
        for (int64_t i = 0; i < n; ++i) {
          if (i + kPrefetch < n) __builtin_prefetch(gx + ca[used[i + kPrefetch]] * d, 1);
          const int64_t k = used[i];
          axpy<CT>(gx + ca[k] * d, g[a] * ds_a[k], fa_a, d);
        }
        if (an[a] >= r0 && an[a] < r1) axpy<CT>(gx + an[a] * d, g[a], dfa + a * d, d);
      }
    }
  });
  // 2. through F.normalize, per row: dL/dx = (G - f <f, G>) / |x|  (|x| > eps; else G / eps)
  at::parallel_for(0, N, 2048, [&](int64_t i0, int64_t i1) {
    std::vector<float> tmp(d);
    for (int64_t i = i0; i < i1; ++i) {
      float* gi = gx + i * d;
      const float* xi = x + i * d;
      const float n2 = dot<CT>(xi, xi, tmp.data(), d);
      const float ix = inv_norm_of(n2);
      const float proj = ix < 1.0f / kNormEps ? dot<CT>(xi, gi, tmp.data(), d) * ix * ix : 0.0f;  // <f, G> / |x|
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) gi[c] = (gi[c] - xi[c] * proj) * ix;
    }
  });
}

template <bool PULL>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> lic_fwd_cpu(const at::Tensor& features,
                                                                       const at::Tensor& anchors,
                                                                       const at::Tensor& candidates,
                                                                       const at::Tensor& kinds, double inv_temperature) {
  check_inputs(PULL ? "lic_pull" : "lic_infonce", features, anchors, candidates, kinds);
  const int64_t A = candidates.size(0), K = candidates.size(1), d = features.size(1);
  auto loss = at::empty({A}, features.options()), fa = at::empty({A, d}, features.options());
  auto dfa = at::empty({A, d}, features.options()), ds = at::empty({A, K}, features.options());
  dispatch_channels(d, [&](auto ct) {
    constexpr int CT = decltype(ct)::value;
    if constexpr (PULL) {
      lic_pull_fwd_impl<CT>(features.data_ptr<float>(), anchors.data_ptr<int64_t>(), candidates.data_ptr<int64_t>(),
                            kinds.data_ptr<uint8_t>(), A, K, d, loss.data_ptr<float>(), fa.data_ptr<float>(),
                            dfa.data_ptr<float>(), ds.data_ptr<float>());
    } else {
      lic_fwd_impl<CT>(features.data_ptr<float>(), anchors.data_ptr<int64_t>(), candidates.data_ptr<int64_t>(),
                       kinds.data_ptr<uint8_t>(), A, K, d, (float)inv_temperature, loss.data_ptr<float>(),
                       fa.data_ptr<float>(), dfa.data_ptr<float>(), ds.data_ptr<float>());
    }
  });
  return {loss, fa, dfa, ds};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> lic_infonce_fwd_cpu(const at::Tensor& features,
                                                                               const at::Tensor& anchors,
                                                                               const at::Tensor& candidates,
                                                                               const at::Tensor& kinds,
                                                                               double inv_temperature) {
  return lic_fwd_cpu<false>(features, anchors, candidates, kinds, inv_temperature);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> lic_pull_fwd_cpu(const at::Tensor& features,
                                                                            const at::Tensor& anchors,
                                                                            const at::Tensor& candidates,
                                                                            const at::Tensor& kinds) {
  return lic_fwd_cpu<true>(features, anchors, candidates, kinds, 1.0);
}

at::Tensor lic_infonce_bwd_cpu(const at::Tensor& features, const at::Tensor& anchors, const at::Tensor& candidates,
                               const at::Tensor& kinds, const at::Tensor& anchor_feats, const at::Tensor& d_anchor,
                               const at::Tensor& d_sim, const at::Tensor& grad_loss) {
  check_inputs("lic_infonce_bwd", features, anchors, candidates, kinds);
  const int64_t N = features.size(0), A = candidates.size(0), K = candidates.size(1), d = features.size(1);
  TORCH_CHECK(anchor_feats.sizes() == d_anchor.sizes() && anchor_feats.size(0) == A && anchor_feats.size(1) == d &&
                  d_sim.sizes() == candidates.sizes() && grad_loss.numel() == A,
              "lic_infonce_bwd: anchor_feats, d_anchor [A, d], d_sim [A, K] and grad_loss [A] expected");
  for (const auto* t : {&anchor_feats, &d_anchor, &d_sim, &grad_loss}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat, "lic_infonce_bwd expects float32 tensors");
  }
  const auto fa = anchor_feats.contiguous(), dfa = d_anchor.contiguous(), ds = d_sim.contiguous();
  const auto gl = grad_loss.contiguous();
  auto gx = at::zeros_like(features);
  dispatch_channels(d, [&](auto ct) {
    lic_bwd_impl<decltype(ct)::value>(features.data_ptr<float>(), anchors.data_ptr<int64_t>(),
                                      candidates.data_ptr<int64_t>(), kinds.data_ptr<uint8_t>(), fa.data_ptr<float>(),
                                      dfa.data_ptr<float>(), ds.data_ptr<float>(), gl.data_ptr<float>(), N, A, K, d,
                                      gx.data_ptr<float>());
  });
  return gx;
}

}  // namespace

TORCH_LIBRARY_IMPL(rh3dgs, CPU, m) {
  m.impl("lic_infonce_fwd", &lic_infonce_fwd_cpu);
  m.impl("lic_pull_fwd", &lic_pull_fwd_cpu);
  m.impl("lic_infonce_bwd", &lic_infonce_bwd_cpu);
}

}  // namespace rh3dgs
