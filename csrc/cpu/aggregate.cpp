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
#include <cstring>
#include <memory>
#include <vector>

#include "../common.h"
#include "dispatch.h"
#include "huge_alloc.h"
#include "reduce.h"
#include "row_alpha.h"
#include "tile_rows.h"
#include "vec16.h"

namespace rh3dgs {
namespace {

// The Huber-IRLS terms of one contribution of weight w whose unit feature has cosine cos_raw to the
// current mean: the clamped cosine, the Huber weight omega = w min(1, delta / theta) and the tangent
// scale omega theta / sin(theta). F = float (one contribution) or vfn (a block of them, the same bits
// per lane: replay_irls_blocks).
template <class F>
inline void irls_terms(F cos_raw, F w, float fdelta, F& cosv, F& omega, F& scale) {
  const F hi = cos_raw < 1.0f ? cos_raw : F{} + 1.0f;  // std::max(-1, std::min(1, cos_raw))
  cosv = -1.0f < hi ? hi : F{} - 1.0f;
  // |z| = |mu| = 1: sin(theta) = sqrt(1 - cos^2). Its rounding near theta = 0 only
  // perturbs theta / sin(theta) = 1 + O(theta^2), so the tangent step stays accurate.
  const F s2 = 1.0f - cosv * cosv;
  const F sinv = sqrt_l(0.0f < s2 ? s2 : F{});  // std::max(0, s2)
  const F theta = atan2_pos(sinv, cosv);
  omega = theta > fdelta ? w * fdelta / theta : w;
  // theta / sin(theta) -> 1 as theta -> 0 (at the antipode z - cos mu = 0 anyway)
  scale = sinv > 1e-12f ? omega * theta / sinv : omega;
}

// Accumulators of one Gaussian over one row segment: raw weight, mean weight (w or omega) and
// the D-vector (w z or omega Log_mu z). With a compile-time D that is a multiple of 16 the vector
// lives in registers; otherwise in a scratch buffer.
template <int CT>
struct SegmentSums {
  static constexpr int kV = (CT > 0 && CT % 16 == 0) ? CT / 16 : 0;
  float raw = 0.0f, wsum = 0.0f, mu_coef = 0.0f;  // raw: sum of alpha * pixel weight; mu_coef: IRLS, sum of scale * cos
  vf16 v16[kV > 0 ? kV : 1] = {};
  float* v;  // generic path
  explicit SegmentSums(float* scratch, int64_t D) : v(scratch) {
    if constexpr (kV == 0) std::fill(v, v + D, 0.0f);
  }

  // One contribution: weight w = alpha T pixel_weight, mass = alpha pixel_weight, unit feature z,
  // current mean mi (IRLS). The traversal and the replay of recorded contributions both call
  // this, so their sums are bit-identical.
  template <int MODE>
  inline void add(float w, float mass, const float* z, const float* mi, int64_t D, float fdelta, float* prod) {
    // w and mass as the rounded products the caller formed: without this barrier GCC may fuse a caller's product
    // into the sums below (raw += a * pw as one multiply-add) at one call site and not at another, and the
    // traversal and the replay would differ in the last bit
#if defined(__x86_64__) || defined(__i386__)
    asm("" : "+x"(w), "+x"(mass));
#elif defined(__aarch64__)
    asm("" : "+w"(w), "+w"(mass));
#endif
    if constexpr (MODE == 0) {
      raw += mass;
      wsum += w;
      if constexpr (kV > 0) {
        for (int u = 0; u < kV; ++u) v16[u] += w * load16(z + 16 * u);
      } else {
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) v[d] += w * z[d];
      }
      return;
    }
    float cosv, omega, scale;
    irls_terms(dot<CT>(mi, z, prod, D), w, fdelta, cosv, omega, scale);
    accumulate(mass, omega, scale, cosv, z, D);
  }

  // One IRLS contribution whose terms (irls_terms) are known: mass, omega, scale and cos.
  inline void accumulate(float mass, float omega, float scale, float cosv, const float* z, int64_t D) {
    raw += mass;
    wsum += omega;
    // scale (z - cos mu): the mu part summed as a scalar, applied once per segment
    mu_coef += scale * cosv;
    if constexpr (kV > 0) {
      for (int u = 0; u < kV; ++u) v16[u] += scale * load16(z + 16 * u);
    } else {
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) v[d] += scale * z[d];
    }
  }

  // The segment's sums into the buffers of Gaussian gi (IRLS: minus mu_coef mu first).
  template <int MODE>
  inline void flush(const float* mi, int64_t D, int64_t gi, float* acc_w, float* acc_raw, float* acc_v) {
    if constexpr (MODE == 1) {
      if constexpr (kV > 0) {
        for (int u = 0; u < kV; ++u) v16[u] -= mu_coef * load16(mi + 16 * u);
      } else {
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) v[d] -= mu_coef * mi[d];
      }
    }
    acc_raw[gi] += raw;
    acc_w[gi] += wsum;
    float* out = acc_v + gi * D;
    if constexpr (kV > 0) {
      for (int u = 0; u < kV; ++u) store16(out + 16 * u, load16(out + 16 * u) + v16[u]);
    } else {
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) out[d] += v[d];
    }
  }
};

// One thread's sums of a pass: [N] weights, [N] raw weights and [N, D] vectors in one huge-page block
// (HugePool keeps it for the next call: a lift aggregates once per view batch and pass, and a fresh
// N x D block per thread and call paid a page fault per 4 KB, as much as replaying a late pass's few
// active Gaussians).
struct ThreadSums {
  std::unique_ptr<float[], HugeDeleter> buf{nullptr, HugeDeleter{0}};
  float *w = nullptr, *raw = nullptr, *v = nullptr;
  void init(int64_t NG, int64_t D) {
    const size_t n = (size_t)NG * (D + 2);
    buf = huge_array<float>(n);
    std::memset(buf.get(), 0, n * sizeof(float));
    w = buf.get(), raw = w + NG, v = raw + NG;
  }
  bool used() const { return w != nullptr; }
};

constexpr int64_t kPrefetch = 6;  // segments ahead

// Starts loading the D-row gi of the means (MODE 1) and of the thread's sums (written next).
template <int MODE>
inline void prefetch_rows_of(int64_t gi, const float* m, float* acc_v, int64_t D) {
  for (int64_t d = 0; d < D; d += 16) {
    if constexpr (MODE == 1) __builtin_prefetch(m + gi * D + d, 0, 3);
    __builtin_prefetch(acc_v + gi * D + d, 1, 3);
  }
}

// One aggregation pass over the tiles of B views (mode 0: init, 1: IRLS step).
template <int CT, int MODE>
void aggregate_tiles(int64_t B, int64_t NB, int64_t H, int64_t W, int64_t D_rt, int64_t TH, int64_t TW,
                     int64_t tile_size, int64_t n_isects, const PackedGaussian* pg, const float* pf, const float* pw,
                     const float* m, const int32_t* offsets, const int32_t* fids, float fdelta, int n_threads,
                     std::vector<ThreadSums>& th, int64_t NG) {
  const int64_t D = CT > 0 ? CT : D_rt;
  const int64_t n_work = B * TH * TW;
#pragma omp parallel num_threads(n_threads)
  {
    const int tid = omp_get_thread_num();
    ThreadSums& sums_t = th[tid];
    sums_t.init(NG, D);
    float *acc_w = sums_t.w, *acc_raw = sums_t.raw, *acc_v = sums_t.v;
    TileGaussians tg;  // the tile's Gaussians (structure of arrays)
    std::vector<int64_t> lg;
    // per-row lanes (one per pixel of the tile row)
    const int64_t L = row_alpha_capacity(tile_size);
    std::vector<float> rT(L), rpw(L), scratch(D), prod(D);
    std::vector<int32_t> rlimit(L);
#pragma omp for schedule(static, 1)
    for (int64_t work = 0; work < n_work; ++work) {
      int64_t start, end;
      tile_bounds(offsets, work, n_work, n_isects, start, end);
      if (end <= start) continue;
      const auto [b, y0, y1, x0, x1] = tile_rect(work, TH, TW, tile_size, H, W);
      const int64_t K = end - start;
      tg.begin(pg, fids + start, K, x0);
      lg.resize(K);
      for (int64_t k = 0; k < K; ++k) lg[k] = fids[start + k] % NB;  // flatten_ids index b * N + n
      // the tile's rows of the sums (and means) are random rows of N x D tables: start them all now
      for (int64_t k = 0; k < K; ++k) prefetch_rows_of<MODE>(lg[k], m, acc_v, D);
      const int64_t nx = x1 - x0;
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
        if (n_open == 0) continue;
        composite_row(tg, fy, x0, nx, rT.data(), rlimit.data(), [&](int64_t k, auto&& pairs) {
          const int64_t gi = lg[k];
          const float* mi = m + gi * D;
          SegmentSums<CT> sums(scratch.data(), D);
          pairs([&](int64_t l, float a, float T) {
            // (alpha T) pixel_weight, as a replay of rasterize_record's alpha T forms it
            const float w = a * T * rpw[l], mass = a * rpw[l];
            sums.template add<MODE>(w, mass, zrow + l * D, mi, D, fdelta, prod.data());
          });
          sums.template flush<MODE>(mi, D, gi, acc_w, acc_raw, acc_v);
        });
      }
    }
  }
}

// Sums the per-thread buffers in thread order (deterministic: 0 + th[0] + th[1] + ...), in parallel over
// Gaussians, into fresh huge-page tensors (at::zeros paged in a new N x D block on every call).
std::tuple<at::Tensor, at::Tensor, at::Tensor> sum_buffers(const std::vector<ThreadSums>& th, int64_t NG, int64_t D,
                                                           const at::TensorOptions& fopt) {
  auto out_w = empty_huge({NG}, fopt), out_v = empty_huge({NG, D}, fopt), out_raw = empty_huge({NG}, fopt);
  float* ow = out_w.data_ptr<float>();
  float* ov = out_v.data_ptr<float>();
  float* oraw = out_raw.data_ptr<float>();
  at::parallel_for(0, NG, 1024, [&](int64_t g0, int64_t g1) {
    std::fill(ow + g0, ow + g1, 0.0f);
    std::fill(oraw + g0, oraw + g1, 0.0f);
    std::fill(ov + g0 * D, ov + g1 * D, 0.0f);
    for (const ThreadSums& t : th) {
      if (!t.used()) continue;  // a thread OpenMP did not start
      for (int64_t g = g0; g < g1; ++g) { ow[g] += t.w[g]; oraw[g] += t.raw[g]; }
      for (int64_t k = g0 * D; k < g1 * D; ++k) ov[k] += t.v[k];
    }
  });
  return {out_w, out_v, out_raw};
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
  // a tile row is a few row units of W lanes (simd.h); recorded lanes are bytes
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
  std::vector<ThreadSums> th(n_threads);
  const std::vector<PackedGaussian> packed = pack_gaussians(B * NB, xy, con, opac);
  dispatch_feature_dims(D, [&](auto ct) {
    constexpr int CT = decltype(ct)::value;
    auto run = [&](auto kernel) {
      kernel(B, NB, H, W, D, TH, TW, tile_size, n_isects, packed.data(), pf, pw, m, offsets, fids, fdelta,
             n_threads, th, NG);
    };
    if (mode == 0) run(aggregate_tiles<CT, 0>); else run(aggregate_tiles<CT, 1>);
  });
  return sum_buffers(th, NG, D, means2d.options());
}

// The replay of recorded contributions (rasterize_record: w = alpha T and alpha per contribution) with
// the pass's pixel weights: contribution (w, alpha) of pixel u adds (w pw(u), alpha pw(u)) as the
// traversal's does, and pixels of weight <= 0 (or NaN) contribute nothing, as the traversal closes them.
// One recording (a render of B views: n_lists tile lists) with the pass's maps pf and weights pw of its views.
struct Recorded {
  const int32_t* segs;
  const uint8_t* lanes;
  const float *ws, *masses;
  const int64_t *so, *po;  // [n_lists + 1] list offsets into segs and into the per-pair arrays
  int64_t n_lists;
  const float *pf, *pw;
};

// The IRLS replay of one recorded list (segments [s, s_end), contributions from p on) in blocks of
// kNativeLanes contributions: their cosines to their Gaussians' means first (independent dot products),
// then their Huber terms as one vector (irls_terms<vfn>), then the sums in recorded order. One
// contribution at a time, the dot product, square root, atan2 and two divisions form a latency chain of
// ~60 cycles that the out-of-order window overlaps with little else; a block keeps the units busy. Same
// per-contribution arithmetic and order as SegmentSums::add<1>: bit-identical sums.
template <int CT>
void replay_irls_blocks(int64_t s, int64_t s_end, int64_t p, const Recorded& r, const float* m, float fdelta,
                        const bool* active, float* acc_w, float* acc_raw, float* acc_v) {
  static_assert(CT > 0 && CT % 16 == 0, "blocks need a compiled feature dimension");
  constexpr int64_t D = CT;
  const float *pf = r.pf, *pw = r.pw;
  constexpr int kB = kNativeLanes;
  alignas(64) float cb[kB], wb[kB], ob[kB], sb[kB], cvb[kB], mb[kB];
  const float* zb[kB];  // nullptr: no contribution, only the end of a segment (its last pixel had weight 0)
  const float* mub[kB];
  int64_t gb[kB];
  bool endb[kB];
  SegmentSums<CT> sums(nullptr, D);
  int64_t gi = 0, pix0 = 0, rem = 0;  // the open segment: Gaussian, first pixel, contributions left
  bool taken = false;                 // ... and whether any of its contributions was taken
  for (;;) {
    int nb = 0;
    while (nb < kB) {
      if (rem == 0) {  // open the next segment of an active Gaussian
        for (; s < s_end; ++s) {
          if (s + kPrefetch < s_end && (!active || active[r.segs[3 * (s + kPrefetch)]]))
            prefetch_rows_of<1>(r.segs[3 * (s + kPrefetch)], m, acc_v, D);
          if (!active || active[r.segs[3 * s]]) break;
          p += r.segs[3 * s + 2];  // a Gaussian whose mean no longer moves (the lift's converged ones)
        }
        if (s >= s_end) break;
        gi = r.segs[3 * s], pix0 = r.segs[3 * s + 1], rem = r.segs[3 * s + 2], taken = false;
        ++s;
      }
      for (; rem > 0 && nb < kB; --rem, ++p) {
        const int64_t pix = pix0 + r.lanes[p];
        const float wpix = pw[pix];
        const bool take = wpix > 0.0f;
        if (!take && !(rem == 1 && taken)) continue;
        zb[nb] = take ? pf + pix * D : nullptr, mub[nb] = m + gi * D, gb[nb] = gi, endb[nb] = rem == 1;
        wb[nb] = take ? r.ws[p] * wpix : 0.0f, mb[nb] = take ? r.masses[p] * wpix : 0.0f;
        taken |= take;
        ++nb;
      }
    }
    if (nb == 0) return;
    for (int j = 0; j < nb; ++j) cb[j] = zb[j] ? dot<CT>(mub[j], zb[j], nullptr, D) : 1.0f;
    for (int j = nb; j < kB; ++j) cb[j] = 1.0f, wb[j] = 0.0f;
    vfn cv, om, sc;
    irls_terms(loadn(cb), loadn(wb), fdelta, cv, om, sc);
    storen(cvb, cv), storen(ob, om), storen(sb, sc);
    for (int j = 0; j < nb; ++j) {
      if (zb[j]) sums.accumulate(mb[j], ob[j], sb[j], cvb[j], zb[j], D);
      if (endb[j]) {
        sums.template flush<1>(mub[j], D, gb[j], acc_w, acc_raw, acc_v);
        sums = SegmentSums<CT>(nullptr, D);
      }
    }
  }
}

// Replays the recorded tile lists as aggregate_tiles' threads traverse the tiles: worker w of T takes
// the tiles w, w + T, ... of each recording in order into buffer w, and the buffers are summed in worker
// order, through the same per-contribution arithmetic (SegmentSums), so the result of one recording is
// bit-identical to a traversal of its views with T threads (T = the thread count now); that of several,
// to their traversals' per-thread sums added in recording order (one pass over all chunks of a lift: one
// set of thread buffers to clear and sum instead of one per chunk).
template <int CT, int MODE>
void replay_lists(const std::vector<Recorded>& recs, const float* m, int64_t D_rt, float fdelta, const bool* active,
                  std::vector<ThreadSums>& th, int64_t NG) {
  const int64_t D = CT > 0 ? CT : D_rt, workers = (int64_t)th.size();
  at::parallel_for(0, workers, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> scratch(D), prod(D);
    for (int64_t wk = w0; wk < w1; ++wk) th[wk].init(NG, D);
    for (int64_t wk = w0; wk < w1; ++wk)
    for (const Recorded& r : recs)
    for (int64_t t = wk; t < r.n_lists; t += workers) {
      const int64_t *so = r.so, *po = r.po;
      const float *pf = r.pf, *pw = r.pw;
      int64_t p = po[t];
      const int64_t s_end = so[t + 1];
      float *acc_w = th[wk].w, *acc_raw = th[wk].raw, *acc_v = th[wk].v;
      if constexpr (MODE == 1 && CT > 0 && CT % 16 == 0) {
        replay_irls_blocks<CT>(so[t], s_end, p, r, m, fdelta, active, acc_w, acc_raw, acc_v);
        continue;
      }
      for (int64_t s = so[t]; s < s_end; ++s) {
        // The segments visit Gaussians in traversal (pixel) order, so each one's mean and sums are a
        // random row of an N x D table: fetch those of a segment kPrefetch ahead while this one runs.
        if (s + kPrefetch < s_end && (!active || active[r.segs[3 * (s + kPrefetch)]]))
          prefetch_rows_of<MODE>(r.segs[3 * (s + kPrefetch)], m, acc_v, D);
        const int64_t gi = r.segs[3 * s], pix0 = r.segs[3 * s + 1], n = r.segs[3 * s + 2];
        if (active && !active[gi]) {  // a Gaussian whose mean no longer moves (the lift's converged ones)
          p += n;
          continue;
        }
        const float* mi = m + gi * D;
        SegmentSums<CT> sums(scratch.data(), D);
        bool taken = false;
        for (int64_t j = 0; j < n; ++j, ++p) {
          const int64_t pix = pix0 + r.lanes[p];
          const float wpix = pw[pix];
          if (!(wpix > 0.0f)) continue;
          sums.template add<MODE>(r.ws[p] * wpix, r.masses[p] * wpix, pf + pix * D, mi, D, fdelta, prod.data());
          taken = true;
        }
        if (taken) sums.template flush<MODE>(mi, D, gi, acc_w, acc_raw, acc_v);
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> aggregate_sphere_replay_cpu(
    at::TensorList seg_off_, at::TensorList pair_off_, at::TensorList segs_, at::TensorList lanes_,
    at::TensorList ws_, at::TensorList masses_, at::TensorList pixel_feats_, at::TensorList pixel_weights_,
    const at::Tensor& mu_, double delta, int64_t mode, const c10::optional<at::Tensor>& active_) {
  TORCH_CHECK(mode == 0 || mode == 1, "mode must be 0 (init) or 1 (IRLS step)");
  const size_t R = seg_off_.size();
  TORCH_CHECK(R >= 1 && pair_off_.size() == R && segs_.size() == R && lanes_.size() == R && ws_.size() == R &&
                  masses_.size() == R && pixel_feats_.size() == R && pixel_weights_.size() == R,
              "aggregate_sphere_replay: one or more recordings, each with its pixel_feats and pixel_weights");
  TORCH_CHECK(mu_.dim() == 2 && mu_.scalar_type() == at::kFloat, "mu must be float [N, D]");
  const int64_t D = mu_.size(1), NG = mu_.size(0);
  std::vector<at::Tensor> keep;  // the contiguous inputs, alive while the kernel runs
  auto held = [&keep](const at::Tensor& t) -> const at::Tensor& { return keep.emplace_back(t.contiguous()); };
  std::vector<Recorded> recs;
  for (size_t i = 0; i < R; ++i) {
    TORCH_CHECK(seg_off_[i].scalar_type() == at::kLong && pair_off_[i].scalar_type() == at::kLong &&
                segs_[i].scalar_type() == at::kInt && lanes_[i].scalar_type() == at::kByte &&
                ws_[i].scalar_type() == at::kFloat && masses_[i].scalar_type() == at::kFloat,
                "recorded contributions have the wrong dtypes");
    const at::Tensor& pf = pixel_feats_[i];
    const at::Tensor& pw = pixel_weights_[i];
    TORCH_CHECK(pf.dim() == 4 && pf.scalar_type() == at::kFloat && pf.size(3) == D,
                "pixel_feats must be float [B,H,W,D] with the D of mu");
    TORCH_CHECK(pw.scalar_type() == at::kFloat && pw.sizes() == pf.sizes().slice(0, 3),
                "pixel_weights must be float [B,H,W] like pixel_feats");
    TORCH_CHECK(segs_[i].dim() == 2 && segs_[i].size(1) == 3, "segments must be [S, 3]");
    TORCH_CHECK(segs_[i].numel() == 0 || segs_[i].select(1, 1).max().item<int64_t>() < pw.numel(),
                "the recorded contributions are of a larger render than pixel_feats [B,H,W,D]");
    recs.push_back({held(segs_[i]).data_ptr<int32_t>(), held(lanes_[i]).data_ptr<uint8_t>(),
                    held(ws_[i]).data_ptr<float>(), held(masses_[i]).data_ptr<float>(),
                    held(seg_off_[i]).data_ptr<int64_t>(), held(pair_off_[i]).data_ptr<int64_t>(),
                    seg_off_[i].numel() - 1, held(pf).data_ptr<float>(), held(pw).data_ptr<float>()});
  }
  const auto mu = mu_.contiguous();
  at::Tensor active;
  if (active_.has_value()) {
    TORCH_CHECK(active_->scalar_type() == at::kBool && active_->dim() == 1 && active_->size(0) == NG,
                "active must be a bool [num_gaussians] mask");
    active = active_->contiguous();
  }
  const int64_t workers = std::max(1, at::get_num_threads());
  std::vector<ThreadSums> th(workers);
  dispatch_feature_dims(D, [&](auto ct) {
    constexpr int CT = decltype(ct)::value;
    auto run = [&](auto kernel) {
      kernel(recs, mu.data_ptr<float>(), D, (float)delta, active.defined() ? active.data_ptr<bool>() : nullptr, th, NG);
    };
    if (mode == 0) run(replay_lists<CT, 0>); else run(replay_lists<CT, 1>);
  });
  return sum_buffers(th, NG, D, mu.options());
}

}  // namespace

TORCH_LIBRARY_IMPL(rh3dgs, CPU, m) {
  m.impl("aggregate_sphere", &aggregate_sphere_cpu);
  m.impl("aggregate_sphere_replay", &aggregate_sphere_replay_cpu);
}

}  // namespace rh3dgs
