// CPU backend of the rh3dgs rasterization core: tile-based front-to-back compositing of
// N-D features with render statistics (A, D1, D2), forward and backward.
//
// Parallelism: OpenMP over (camera, tile) with a dynamic schedule. In the backward pass
// every tile owns the rows of its intersections in per-intersection gradient buffers,
// which are then summed per Gaussian in intersection order, so results are deterministic
// and free of atomics for any thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <torch/library.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <memory>
#include <cmath>
#include <vector>

#include "../common.h"
#include "dispatch.h"
#include "huge_alloc.h"
#include "record.h"
#include "reduce.h"
#include "vec16.h"
#include "row_alpha.h"
#include "simd.h"
#include "tile_rows.h"

namespace rh3dgs {
namespace {

void check_inputs(const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& features,
                  const at::Tensor& opacities, const at::Tensor& depths, const c10::optional<at::Tensor>& backgrounds,
                  const at::Tensor& isect_offsets, const at::Tensor& flatten_ids, int64_t tile_size) {
  // a tile row is a few row units of W lanes (simd.h); recorded lanes are bytes
  TORCH_CHECK(tile_size >= 1 && tile_size <= 64, "tile_size must be in [1, 64], got ", tile_size);
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
  // tile runs partition flatten_ids: 0 = offsets[0] <= offsets[1] <= ... <= n_isects
  const auto offs = isect_offsets.contiguous();
  const int32_t* o = offs.data_ptr<int32_t>();
  const int64_t n_tiles = offs.numel(), n_isects = flatten_ids.numel();
  for (int64_t t = 0; t < n_tiles; ++t) {
    TORCH_CHECK(o[t] >= (t == 0 ? 0 : o[t - 1]) && o[t] <= n_isects && (t > 0 || o[0] == 0),
                "isect_offsets must be non-decreasing from 0 to at most flatten_ids.numel()");
  }
}

// Where a forward writes one tile row: the pixel-major render [.., C] and the per-pixel A, D1, D2, last ids.
struct FwdOut {
  float *render, *alpha, *d1, *d2;
  int32_t* last;
};

// The forward of one row unit: the W = Unit::W pixels x0 + u0 .. x0 + u0 + nu - 1 of the row at fy, one per lane,
// Gaussian by Gaussian in depth order (composite_row's order: the recordings replayed by the aggregation follow it).
// Per lane the operations and their order are those of a front-to-back scan of its pixel: alpha, the pixel's end
// before the Gaussian that would bring T to <= 1e-4 (its lane leaves `open`), then w = alpha T, acc += w f,
// d1 += w z, d2 += (w z) z, T *= 1 - alpha in the lanes it composites onto. The channels' accumulators are
// registers (CT > 0) or racc [C][W] (CT = 0); ob [C][W] is scratch for the pixel-major store.
template <int CT, bool REC>
inline void fwd_unit(TileGaussians& tg, float fy, int64_t x0, int64_t u0, int nu, const float* __restrict feat,
                     int64_t C, int64_t start, const float* __restrict bgb, float* __restrict racc, float* __restrict ob,
                     const FwdOut& out, int64_t pix0, ThreadRecord* rec, const int32_t* fids, int64_t N) {
  using S = Unit;
  using V = S::V;
  using VI = S::VI;
  using M = S::M;
  constexpr int W = S::W;
  constexpr int G = TileGaussians::G;
  V px;
  for (int l = 0; l < W; ++l) px[l] = (float)(u0 + l);
  V T = splat<V>(1.0f), d1{}, d2{};
  VI last = VI{} - 1;
  M open = S::first(nu);
  V acc[CT > 0 ? CT : 1];
  static_for<(CT > 0 ? CT : 1)>([&](auto c) { acc[c] = V{}; });
  if constexpr (CT == 0) std::fill(racc, racc + C * W, 0.0f);
  const float c0 = (float)(x0 + u0), c1 = (float)(x0 + u0 + nu - 1);
  const int64_t n_groups = tg.n_groups;
  for (int64_t g = 0; g < n_groups && S::any(open); ++g) {
    tg.ensure(g);
    uint32_t m = tg.mask(g, fy, c0, c1);
    if (!m) continue;
    const float *ty = tg.y, *txg = tg.xg.data(), *th = tg.h, *thc = tg.hc, *tb = tg.b, *to = tg.o, *tz = tg.z;
    const int32_t* tid = tg.id.data();
    // the group's Gaussians one by one, each one's alpha computed while the one before it composites
    // (independent work: the exp chain overlaps the compositing's dependency on T)
    auto alpha_of = [&](int64_t k, M& ok) {
      const float dy = ty[k] - fy;
      V vis;
      return alpha_kept<W>(txg[k], th[k], thc[k] * dy * dy, tb[k] * dy, to[k], px, ok, vis);
    };
    int64_t k = g * G + std::countr_zero(m);
    M ok;
    V al = alpha_of(k, ok);
    for (;;) {
      m &= m - 1;
      const int64_t kn = m ? g * G + std::countr_zero(m) : k;
      M ok_n;
      const V al_n = alpha_of(kn, ok_n);
      M live = ok & open;
      if (S::any(live)) {
        const V next_T = T * (1.0f - al);
        const M ends = S::le(next_T, splat<V>(kTransmittanceMin)) & live;  // the pixel ends before this Gaussian
        if (S::any(ends)) {
          open = S::andnot(ends, open);
          live = S::andnot(ends, live);
        }
        const V w = al * T;
        const float* f = feat + (int64_t)tid[k] * C;
        if constexpr (CT > 0) {
          static_for<CT>([&](auto c) { acc[c] = S::fma_bcast(live, w, f + c, acc[c]); });
        } else {
          for (int64_t c = 0; c < C; ++c) S::store(racc + c * W, S::fma_bcast(live, w, f + c, S::load(racc + c * W)));
        }
        const V wz = w * tz[k];
        d1 = S::add(live, d1, wz);
        d2 = S::fma_bcast(live, wz, tz + k, d2);
        last = S::blend(live, VI{} + (int32_t)(start + k), last);
        T = S::blend(live, next_T, T);
        if constexpr (REC) {
          const uint32_t lm = S::bits(live);
          if (lm) {
            alignas(64) float wb[W], ab[W];
            S::store(wb, w);
            S::store(ab, al);
            const size_t n_before = rec->w.size();
            rec->make_room((size_t)W);
            uint8_t* rec_lane = rec->lane.end();
            float *rec_w = rec->w.end(), *rec_mass = rec->mass.end();
            for (uint32_t q = lm; q; q &= q - 1) {
              const int l = std::countr_zero(q);
              *rec_lane++ = (uint8_t)(u0 + l), *rec_w++ = wb[l], *rec_mass++ = ab[l];
            }
            rec->commit((size_t)std::popcount(lm));
            rec->close_segment(n_before, fids[start + k] % N, pix0);
          }
        }
        if (!S::any(open)) break;  // every pixel of the unit has ended
      }
      if (!m) break;
      k = kn, al = al_n, ok = ok_n;
    }
  }
  const int64_t pix = pix0 + u0;
  S::store_first(out.alpha + pix, 1.0f - T, nu);
  S::store_first(out.d1 + pix, d1, nu);
  S::store_first(out.d2 + pix, d2, nu);
  S::store_first(out.last + pix, last, nu);
  // the features: acc + T bg, written pixel-major: a full unit of 16 lanes by register transposes (RGB: one
  // interleave; 16-channel blocks: 16 x 16 transposes), anything else channel-major through ob
  if constexpr (CT > 0 && W == 16) {
    if (nu == W) {
      float* o = out.render + pix * CT;
      V oc[CT];
      static_for<CT>([&](auto c) { oc[c] = acc[c] + (bgb ? T * bgb[c] : V{}); });
      if constexpr (CT == 3) {
        store_rgb16(oc, o);
      } else {
        constexpr int h = CT % 8, n16 = (CT - h) / 16, n8 = ((CT - h) % 16) / 8;
        static_for<h>([&](auto c) { S::store(ob + c * W, oc[c]); });
        for (int l = 0; l < W; ++l)
          for (int c = 0; c < h; ++c) o[l * CT + c] = ob[c * W + l];
        static_for<n16>([&](auto bl) {
          vf16 r[16];
          static_for<16>([&](auto i) { r[i] = oc[h + 16 * bl + i]; });
          transpose16(r);
          for (int l = 0; l < W; ++l) store16(o + l * CT + h + 16 * bl, r[l]);
        });
        if constexpr (n8 > 0) {
          static_for<8>([&](auto i) { S::store(ob + i * W, oc[h + 16 * n16 + i]); });
          store_pixel_major<W, 8>(ob, 8, ob + 8 * W, W);  // [16 pixels][8] contiguous
          for (int l = 0; l < W; ++l) store8(o + l * CT + h + 16 * n16, load8(ob + 8 * W + 8 * l));
        }
      }
      return;
    }
  }
  if constexpr (CT > 0) {
    static_for<CT>([&](auto c) { S::store(ob + c * W, acc[c] + (bgb ? T * bgb[c] : V{})); });
  } else {
    for (int64_t c = 0; c < C; ++c) S::store(ob + c * W, S::load(racc + c * W) + (bgb ? T * bgb[c] : V{}));
  }
  store_pixel_major<W, CT>(ob, C, out.render + pix * C, nu);
}

// REC: also record every (Gaussian, pixel) contribution, per tile (rasterize_record).
template <int CT, bool REC = false>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rasterize_fwd_impl(
    const at::Tensor& means2d_, const at::Tensor& conics_, const at::Tensor& features_,
    const at::Tensor& opacities_, const at::Tensor& depths_, const c10::optional<at::Tensor>& backgrounds_,
    int64_t width, int64_t height, int64_t tile_size, const at::Tensor& isect_offsets_,
    const at::Tensor& flatten_ids_, std::vector<ThreadRecord>* records = nullptr) {
  const auto means2d = means2d_.contiguous(), conics = conics_.contiguous(), features = features_.contiguous();
  const auto opacities = opacities_.contiguous(), depths = depths_.contiguous();
  const auto isect_offsets = isect_offsets_.contiguous(), flatten_ids = flatten_ids_.contiguous();
  at::Tensor backgrounds;
  if (backgrounds_.has_value()) backgrounds = backgrounds_->contiguous();

  const int64_t B = means2d.size(0), N = means2d.size(1), C = CT > 0 ? CT : features.size(2);
  const int64_t TH = isect_offsets.size(1), TW = isect_offsets.size(2);
  TORCH_CHECK(TH * tile_size >= height && TW * tile_size >= width, "isect_offsets [", TH, ", ", TW,
              "] tiles of ", tile_size, " px do not cover a ", height, "x", width, " image");
  const int64_t n_isects = flatten_ids.numel();
  auto fopt = means2d.options();
  // every pixel belongs to one tile and is written below (tiles without Gaussians included)
  // (on huge pages: paging in a fresh render costs more than compositing it, see huge_alloc.h)
  auto render = empty_huge({B, height, width, C}, fopt);
  auto alpha = empty_huge({B, height, width}, fopt);
  auto d1 = empty_huge({B, height, width}, fopt);
  auto d2 = empty_huge({B, height, width}, fopt);
  auto last_ids = empty_huge({B, height, width}, fopt.dtype(at::kInt));

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

  const int64_t n_work = B * TH * TW;
  const std::vector<PackedGaussian> packed = pack_gaussians(B * N, xy, con, opac, dep);
#pragma omp parallel num_threads(at::get_num_threads())
  {
    ThreadRecord* rec = nullptr;
    if constexpr (REC) {  // ~3.3 contributions per intersection on dense scenes: avoid regrowing
      rec = &(*records)[omp_get_thread_num()];
      rec->reserve((size_t)(4 * n_isects / omp_get_num_threads()));
    }
    TileGaussians tg;  // the tile's Gaussians (structure of arrays), gathered as the rows reach them
    constexpr int W = Unit::W;
    // generic channel count: the accumulators in memory, channel-major [C][W]; ob: a row unit's channels before
    // they are written pixel-major
    std::vector<float> racc(CT > 0 ? 0 : C * W);
    std::vector<float> ob(std::max<int64_t>(C, 16) * W);
    const FwdOut fo{out, out_a, out_d1, out_d2, out_last};
    auto tile = [&](int64_t work) {
      if constexpr (REC) rec->begin_tile(work);
      const auto [b, y0, y1, x0, x1] = tile_rect(work, TH, TW, tile_size, height, width);
      int64_t start, end;
      tile_bounds(offsets, work, n_work, n_isects, start, end);
      tg.begin(packed.data(), fids + start, end - start, x0, feat, C);
      const int64_t nx = x1 - x0;
      const float* bgb = bg ? bg + b * C : nullptr;
      for (int64_t py = y0; py < y1; ++py) {
        const int64_t pix0 = (b * height + py) * width + x0;
        for (int64_t u0 = 0; u0 < nx; u0 += W)
          fwd_unit<CT, REC>(tg, (float)py + 0.5f, x0, u0, (int)std::min<int64_t>(W, nx - u0), feat, C, start, bgb,
                            racc.data(), ob.data(), fo, pix0, rec, fids, N);
      }
    };
#pragma omp for schedule(dynamic, 1)
    for (int64_t work = 0; work < n_work; ++work) tile(work);
  }
  return {render, alpha, d1, d2, last_ids};
}

// What a backward reads besides the tile's Gaussians: the features [*, C] (channels [0, CG) shape the geometry),
// the background of the tile's camera, the forward's A and last ids and the upstream gradients.
struct BwdCtx {
  const float* feat;
  int64_t C, CG;
  const float *bg, *A;
  const int32_t* lasts;
  const float *vr, *va, *vd1, *vd2;
  const float* bgb = nullptr;
};

// The backward of one row unit (the forward's fwd_unit): Gaussian-major, back to front from the unit's last
// contributor; per lane the quantities of a back-to-front scan of its pixel (T in front of the Gaussian, the sums of
// what lies behind it). grows: the tile's per-intersection gradient rows [K][7 + C]; vo [max(CG, C % 8)] and cm
// [8 W]: scratch.
template <int CT>
inline void bwd_unit(TileGaussians& tg, float fy, int64_t x0, int64_t u0, int nu, const BwdCtx& bc, int64_t pix0,
                     int64_t start, float* __restrict grows, Unit::V* __restrict vo, float* __restrict cm) {
  using S = Unit;
  using V = S::V;
  using VI = S::VI;
  using M = S::M;
  constexpr int W = S::W;
  constexpr int G = TileGaussians::G;
  const int64_t C = CT > 0 ? CT : bc.C, CG = bc.CG, SR = 7 + C;
  // the channels: kH = C % 8 "head" channels (RGB in RGB + 8 / 16 / 32 latents), then blocks of 16 and at most one
  // of 8; the head's feature gradients are lane sums (reduce8, with the geometry's), the blocks' are added pair by
  // pair in registers from the pixels' upstream rows
  const int64_t kH = C % 8, n_vo = std::max(CG, kH);
  const int64_t pix = pix0 + u0;
  VI lastk = S::load_first(bc.lasts + pix, nu) - (int32_t)start;  // -1 - start < -1 for none: never reached
  lastk = S::blend(S::first(nu), lastk, VI{} - 1);
  int32_t max_last = -1;
  for (int l = 0; l < W; ++l) max_last = std::max(max_last, lastk[l]);
  if (max_last < 0) return;
  const V Tf = 1.0f - S::load_first(bc.A + pix, nu);  // T after the pixel's last contributor
  const V vD1 = S::load_first(bc.vd1 + pix, nu), vD2 = S::load_first(bc.vd2 + pix, nu);
  const V vA = S::load_first(bc.va + pix, nu);
  // the upstream gradient of the channels [0, n_vo), channel-major: the head one by one, blocks of 8 by 8 x 8
  // transposes
  const float* v_row = bc.vr + pix * C;  // [nu][C], pixel-major
  for (int64_t c = 0; c < std::min(n_vo, kH); ++c) {
    V t{};
    for (int l = 0; l < nu; ++l) t[l] = v_row[l * C + c];
    vo[c] = t;
  }
  for (int64_t c0 = kH; c0 < n_vo; c0 += 8) {
    for (int p0 = 0; p0 < W; p0 += 8) {
      vf8 r8[8];
      for (int l = 0; l < 8; ++l) r8[l] = p0 + l < nu ? load8(v_row + (p0 + l) * C + c0) : vf8{};
      transpose8(r8);
      for (int i = 0; i < 8; ++i) store8(cm + i * W + p0, r8[i]);
    }
    for (int64_t i = 0; i < std::min<int64_t>(8, n_vo - c0); ++i) vo[c0 + i] = S::load(cm + i * W);
  }
  V bgdot{};  // sum_c bg_c v_out_c over the geometry channels, in channel order
  if (bc.bgb)
    for (int64_t c = 0; c < CG; ++c) bgdot = S::fma(S::first(W), splat<V>(bc.bgb[c]), vo[c], bgdot);
  const V vAb = vA - bgdot;
  V T = Tf, b1{}, b2{}, Q{};  // T: in front of the Gaussian at hand; behind-sums of w z, w z^2, w P
  V px;
  for (int l = 0; l < W; ++l) px[l] = (float)(u0 + l);
  const float c0 = (float)(x0 + u0), c1 = (float)(x0 + u0 + nu - 1);
  const int64_t g_last = TileGaussians::group_of(max_last);
  tg.ensure(g_last);
  const float *ty = tg.y, *txg = tg.xg.data(), *th = tg.h, *thc = tg.hc, *ta = tg.a, *tb = tg.b, *tc = tg.c;
  const float *to = tg.o, *tz = tg.z;
  const int32_t* tid = tg.id.data();
  const float* feat = bc.feat;
  for (int64_t g = g_last; g >= 0; --g) {
    uint32_t m = tg.mask(g, fy, c0, c1);
    if (g == g_last) m &= (uint32_t)((2ull << (max_last - g * G)) - 1);
    if (!m) continue;
    // back to front; each Gaussian's alpha computed while the one behind it is processed
    auto alpha_of = [&](int64_t k, M& ok, V& vis) {
      const float dy = ty[k] - fy;
      return alpha_kept<W>(txg[k], th[k], thc[k] * dy * dy, tb[k] * dy, to[k], px, ok, vis);
    };
    int64_t k = g * G + 31 - std::countl_zero(m);
    M ok;
    V vis;
    V al = alpha_of(k, ok, vis);
    for (;;) {
      m &= ~(1u << (k - g * G));
      const int64_t kn = m ? g * G + 31 - std::countl_zero(m) : k;
      M ok_n;
      V vis_n;
      const V al_n = alpha_of(kn, ok_n, vis_n);
      // the pixels this pair contributes to: alpha kept, not behind the pixel's last contributor
      const M live = ok & S::lei((int32_t)k, lastk);
      if (S::any(live)) {
        const float dy = ty[k] - fy, mx0 = txg[k];
        const float a_ = ta[k], b_ = tb[k], c_ = tc[k], o = to[k], z = tz[k];
        const float* f = feat + (int64_t)tid[k] * C;
        const V ra = 1.0f / (1.0f - al);
        T = S::blend(live, T * ra, T);  // transmittance in front of this Gaussian
        const V w = al * T;
        // d loss / d alpha: the geometry channels' sum_c (f_c T - behind_c / (1 - alpha)) v_out_c as
        // T P - Q / (1 - alpha), P = sum_c f_c v_out_c and Q = sum over the Gaussians behind of w P (four partial
        // sums, channel c into c % 4, added pairwise: one chain of CG dependent multiply-adds was the longest
        // latency of a segment)
        V Pp[4] = {};
        if constexpr (CT > 0) {
          static_for<CT>([&](auto c) {
            if (c < CG) Pp[c % 4] = S::fma_bcast(S::first(W), vo[c], f + c, Pp[c % 4]);
          });
        } else {
          for (int64_t c = 0; c < CG; ++c) Pp[c % 4] = S::fma_bcast(S::first(W), vo[c], f + c, Pp[c % 4]);
        }
        const V P = (Pp[0] + Pp[1]) + (Pp[2] + Pp[3]);
        V v_a = T * P - ra * Q;
        v_a += (z * T - b1 * ra) * vD1 + (z * z * T - b2 * ra) * vD2;
        v_a += Tf * ra * vAb;
        Q = S::fma(live, w, P, Q);
        b1 = S::fma(live, splat<V>(z), w, b1);
        b2 = S::fma(live, splat<V>(z * z), w, b2);
        // the geometry: sigma's gradient -o vis v_a where the alpha is not clamped; its sums over the lanes as
        // u = vis v_a times 1, dx, dx^2 (dy is the row's)
        const M cl = live & S::le(o * vis, splat<V>(kAlphaMax));
        const V u = S::blend(cl, vis * v_a, V{});
        const V dx = mx0 - px;
        // lane sums: u, u dx, u dx^2, the depth's w (v_D1 + 2 z v_D2), then the head's d features w v_out_c
        V q[4 + 7];
        q[0] = u;
        q[1] = u * dx;
        q[2] = u * dx * dx;
        q[3] = S::blend(live, w * (vD1 + 2.0f * z * vD2), V{});
        const V wl = S::blend(live, w, V{});
        for (int64_t c = 0; c < kH; ++c) q[4 + c] = wl * vo[c];
        alignas(32) float sums[16];
        for (int64_t q0 = 0; q0 < 4 + kH; q0 += 8) {
          V qq[8];
          for (int i = 0; i < 8; ++i) qq[kReducePerm[i]] = q0 + i < 4 + kH ? q[q0 + i] : V{};
          store8(sums + q0, reduce8(qq));
        }
        const float U0 = sums[0], U1 = sums[1], U2 = sums[2];
        float* grow = grows + (size_t)k * SR;
        grow[0] += -o * (a_ * U1 + b_ * dy * U0);
        grow[1] += -o * (b_ * U1 + c_ * dy * U0);
        grow[2] += -0.5f * o * U2;
        grow[3] += -o * dy * U1;
        grow[4] += -0.5f * o * dy * dy * U0;
        grow[5] += U0;
        grow[6] += sums[3];
        for (int64_t c = 0; c < kH; ++c) grow[7 + c] += sums[4 + c];
        // the blocks' d features: w v_out, pixel by pixel from the upstream rows
        if (C > kH) {
          alignas(64) float wb[W];
          S::store(wb, w);
          const uint32_t lm = S::bits(live);
          float* gblk = grow + 7 + kH;
          const float* vblk = v_row + kH;
          if constexpr (CT > 0) {
            constexpr int k16 = (CT - CT % 8) / 16, k8 = ((CT - CT % 8) % 16) / 8;
            vf16 g16[k16 > 0 ? k16 : 1] = {};
            vf8 g8{};
            for (uint32_t mm = lm; mm; mm &= mm - 1) {
              const int l = std::countr_zero(mm);
              const float wl1 = wb[l];
              const float* vrow = vblk + l * C;
              static_for<k16>([&](auto i) { g16[i] += wl1 * load16(vrow + 16 * i); });
              if constexpr (k8 > 0) g8 += wl1 * load8(vrow + 16 * k16);
            }
            static_for<k16>([&](auto i) { store16(gblk + 16 * i, load16(gblk + 16 * i) + g16[i]); });
            if constexpr (k8 > 0) store8(gblk + 16 * k16, load8(gblk + 16 * k16) + g8);
          } else {
            for (uint32_t mm = lm; mm; mm &= mm - 1) {
              const int l = std::countr_zero(mm);
              axpy<0>(gblk, wb[l], vblk + l * C, C - kH);
            }
          }
        }
      }
      if (!m) break;
      k = kn, al = al_n, ok = ok_n, vis = vis_n;
    }
  }
}

template <int CT>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rasterize_bwd_impl(
    const at::Tensor& means2d_, const at::Tensor& conics_, const at::Tensor& features_,
    const at::Tensor& opacities_, const at::Tensor& depths_, const c10::optional<at::Tensor>& backgrounds_,
    int64_t width, int64_t height, int64_t tile_size, const at::Tensor& isect_offsets_,
    const at::Tensor& flatten_ids_, const at::Tensor& alpha_, const at::Tensor& last_ids_,
    const at::Tensor& v_render_, const at::Tensor& v_alpha_, const at::Tensor& v_d1_, const at::Tensor& v_d2_,
    int64_t geometry_channels) {
  const auto means2d = means2d_.contiguous(), conics = conics_.contiguous(), features = features_.contiguous();
  const auto opacities = opacities_.contiguous(), depths = depths_.contiguous();
  const auto isect_offsets = isect_offsets_.contiguous(), flatten_ids = flatten_ids_.contiguous();
  const auto alpha = alpha_.contiguous(), last_ids = last_ids_.contiguous();
  const auto v_render = v_render_.contiguous(), v_alpha = v_alpha_.contiguous();
  const auto v_d1 = v_d1_.contiguous(), v_d2 = v_d2_.contiguous();
  at::Tensor backgrounds;
  if (backgrounds_.has_value()) backgrounds = backgrounds_->contiguous();

  const int64_t B = means2d.size(0), N = means2d.size(1), C = CT > 0 ? CT : features.size(2);
  // channels [0, CG) pass their gradient on to the geometry, [CG, C) only to their features
  const int64_t CG = geometry_channels < 0 ? C : std::min<int64_t>(geometry_channels, C);
  const int64_t n_vo = std::max(CG, C % 8);  // upstream channels needed lane-parallel (channel-major, bwd_unit)
  const int64_t TH = isect_offsets.size(1), TW = isect_offsets.size(2);
  const int64_t n_isects = flatten_ids.numel();
  // Per-intersection gradient rows: [xy(2), conic(3), opacity(1), depth(1), features(C)].
  const int64_t SR = 7 + C;
  // Zeroed per tile inside the parallel loop (every intersection belongs to exactly one tile).
  const auto isect_grad = huge_array<float>((size_t)n_isects * SR);

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
  const std::vector<PackedGaussian> packed = pack_gaussians(B * N, xy, con, opac, dep);
#pragma omp parallel num_threads(at::get_num_threads())
  {
    constexpr int W = Unit::W;  // W pixels of a tile row in the lanes of one register
    TileGaussians tg;  // the tile's Gaussians (structure of arrays)
    std::vector<Unit::V> vo(std::max<int64_t>(n_vo, 1));  // upstream channels [0, n_vo), channel-major
    alignas(64) float cm[8 * W];                     // scratch of the transposes
    BwdCtx bc{feat, C, CG, bg, A, lasts, vr, va, vd1, vd2};
#pragma omp for schedule(dynamic, 1)
    for (int64_t work = 0; work < n_work; ++work) {
      int64_t start, end;
      tile_bounds(offsets, work, n_work, n_isects, start, end);
      if (end <= start) continue;
      const auto [b, y0, y1, x0, x1] = tile_rect(work, TH, TW, tile_size, height, width);
      const int64_t K = end - start;
      std::fill(isect_grad.get() + start * SR, isect_grad.get() + end * SR, 0.0f);
      tg.begin(packed.data(), fids + start, K, x0, feat, C);
      const int64_t nx = x1 - x0;
      bc.bgb = bg ? bg + b * C : nullptr;
      for (int64_t py = y0; py < y1; ++py) {
        const float fy = (float)py + 0.5f;
        const int64_t pix0 = (b * height + py) * width + x0;
        for (int64_t u0 = 0; u0 < nx; u0 += W)
          bwd_unit<CT>(tg, fy, x0, u0, (int)std::min<int64_t>(W, nx - u0), bc, pix0, start, isect_grad.get() + start * SR,
                       vo.data(), cm);
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
  // Deterministic reduction of intersection rows into Gaussians: each thread owns a range of
  // Gaussians and adds their rows in intersection order (the same order for any thread count).
  const int64_t NG = B * N;
  at::parallel_for(0, NG, 4096, [&](int64_t g0, int64_t g1) {
    for (int64_t i = 0; i < n_isects; ++i) {
      const int64_t g = fids[i];
      if (g < g0 || g >= g1) continue;
      const float* row = isect_grad.get() + (size_t)i * SR;
      gxy[2 * g] += row[0]; gxy[2 * g + 1] += row[1];
      gcon[3 * g] += row[2]; gcon[3 * g + 1] += row[3]; gcon[3 * g + 2] += row[4];
      gop[g] += row[5];
      gdep[g] += row[6];
      axpy<CT>(gfeat + g * C, 1.0f, row + 7, C);
    }
  });
  return {v_means2d, v_conics, v_features, v_opacities, v_depths};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rasterize_fwd_cpu(
    const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& features, const at::Tensor& opacities,
    const at::Tensor& depths, const c10::optional<at::Tensor>& backgrounds, int64_t width, int64_t height,
    int64_t tile_size, const at::Tensor& isect_offsets, const at::Tensor& flatten_ids) {
  check_inputs(means2d, conics, features, opacities, depths, backgrounds, isect_offsets, flatten_ids, tile_size);
  return dispatch_channels(features.size(2), [&](auto ct) {
    return rasterize_fwd_impl<decltype(ct)::value>(means2d, conics, features, opacities, depths, backgrounds, width,
                                                   height, tile_size, isect_offsets, flatten_ids);
  });
}

// rasterize_fwd that also records every (Gaussian, pixel) contribution: its outputs, then one list per
// tile (record.h) with w = alpha T and alpha per contribution.
std::vector<at::Tensor> rasterize_record_cpu(const at::Tensor& means2d, const at::Tensor& conics,
                                             const at::Tensor& features, const at::Tensor& opacities,
                                             const at::Tensor& depths, const c10::optional<at::Tensor>& backgrounds,
                                             int64_t width, int64_t height, int64_t tile_size,
                                             const at::Tensor& isect_offsets, const at::Tensor& flatten_ids) {
  check_inputs(means2d, conics, features, opacities, depths, backgrounds, isect_offsets, flatten_ids, tile_size);
  TORCH_CHECK(means2d.size(0) * height * width < (int64_t)std::numeric_limits<int32_t>::max(),
              "recording needs fewer than 2^31 pixels per call");
  std::vector<ThreadRecord> records(std::max(1, at::get_num_threads()));
  auto [render, alpha, d1, d2, last_ids] = dispatch_channels(features.size(2), [&](auto ct) {
    return rasterize_fwd_impl<decltype(ct)::value, true>(means2d, conics, features, opacities, depths, backgrounds,
                                                         width, height, tile_size, isect_offsets, flatten_ids,
                                                         &records);
  });
  std::vector<at::Tensor> out{render, alpha, d1, d2, last_ids};
  for (auto& t : records_to_tensors(records, isect_offsets.numel())) out.push_back(t);
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rasterize_bwd_cpu(
    const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& features, const at::Tensor& opacities,
    const at::Tensor& depths, const c10::optional<at::Tensor>& backgrounds, int64_t width, int64_t height,
    int64_t tile_size, const at::Tensor& isect_offsets, const at::Tensor& flatten_ids, const at::Tensor& alpha,
    const at::Tensor& last_ids, const at::Tensor& v_render, const at::Tensor& v_alpha, const at::Tensor& v_d1,
    const at::Tensor& v_d2, int64_t geometry_channels) {
  check_inputs(means2d, conics, features, opacities, depths, backgrounds, isect_offsets, flatten_ids, tile_size);
  return dispatch_channels(features.size(2), [&](auto ct) {
    return rasterize_bwd_impl<decltype(ct)::value>(means2d, conics, features, opacities, depths, backgrounds, width,
                                                   height, tile_size, isect_offsets, flatten_ids, alpha, last_ids,
                                                   v_render, v_alpha, v_d1, v_d2, geometry_channels);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(rh3dgs, CPU, m) {
  m.impl("rasterize_fwd", &rasterize_fwd_cpu);
  m.impl("rasterize_bwd", &rasterize_bwd_cpu);
  m.impl("rasterize_record", &rasterize_record_cpu);
}

}  // namespace rh3dgs
