// Tiles and per-row culling for the CPU kernels: packed Gaussians, a tile's Gaussians, for every
// pixel row of a tile the Gaussians (in depth order) whose alpha can reach 1/255 on that row,
// and the front-to-back traversal of a row. A pair outside the conservative ellipse box has
// sigma > log(255 o) and would be skipped by the alpha rule anyway, so results are
// bit-identical to scanning every Gaussian.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include <ATen/Parallel.h>

#include "../common.h"
#include "fastmath.h"
#include "row_alpha.h"
#include "simd.h"
#include "vec16.h"

namespace rh3dgs {

// One Gaussian of one view as the CPU kernels read it, one 64-byte record (one cache line per Gaussian
// gathered into a tile): 2D mean, conic, opacity, a / 2 and c / 2 (sigma's terms), depth, and the terms of
// TileGaussians' row test: the box half-height ey (outside the box alpha < 1/255), b / a, 1 / ey_w^2, hx0 and the
// slack, computed once per Gaussian rather than per tile intersection; kind: 0 = never reaches alpha 1/255,
// 1 = a proper conic, 2 = degenerate (no culling).
struct alignas(64) PackedGaussian {
  float x, y, a, b, c, o, h, hc, z, ey, ba, inv_ey2, hx0, slack, kind, pad;
};
static_assert(sizeof(PackedGaussian) == 64, "one cache line per Gaussian");
constexpr int kPackedFields = 16;

// Packs n Gaussians (means2d [n,2], conics [n,3], opacities [n], depths [n] or nullptr) in parallel: per Gaussian
// once, not per tile intersection. The row test's terms: the ellipse sigma <= s (s = log(255 o)) has half-widths
// ex = sqrt(2 s cov_xx), ey = sqrt(2 s cov_yy) (rounded up: * 1.001 + 0.01), and on the row at dy the half-width
// hx0 sqrt(1 - dy^2 / ey_w^2) around x_c = mx + (b / a) dy, with ey_w = ey * 1.005 + 0.05 and hx0 = ey_w sqrt(det) / a.
inline std::vector<PackedGaussian> pack_gaussians(int64_t n, const float* xy, const float* con, const float* opac,
                                                  const float* depths = nullptr) {
  std::vector<PackedGaussian> out(n);
  at::parallel_for(0, n, 2048, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const float a = con[3 * g], b = con[3 * g + 1], c = con[3 * g + 2], o = opac[g];
      float ex = -1.0f, ey = -1.0f;
      if (o * 255.0f > 1.0f) {
        const float s = std::min(std::log(255.0f * o), kSigmaSkip);
        const float det = a * c - b * b;
        if (det > 0.0f && a > 0.0f && c > 0.0f) {
          ex = std::sqrt(2.0f * s * c / det) * 1.001f + 0.01f;  // cov_xx = c / det
          ey = std::sqrt(2.0f * s * a / det) * 1.001f + 0.01f;  // cov_yy = a / det
        } else {  // degenerate conic: no culling
          ex = ey = 1e30f;
        }
        if (!(ex < 1e29f)) ex = 1e30f;
        if (!(ey < 1e29f)) ey = 1e30f;
      }
      PackedGaussian& q = out[g];
      q.x = xy[2 * g], q.y = xy[2 * g + 1], q.a = a, q.b = b, q.c = c, q.o = o;
      q.h = 0.5f * a, q.hc = 0.5f * c, q.z = depths ? depths[g] : 0.0f, q.ey = ey, q.pad = 0.0f;
      q.kind = !(ex >= 0.0f) ? 0.0f : (ex < 1e29f && ey < 1e29f) ? 1.0f : 2.0f;
      const float ia = 1.0f / a, eyw = ey * 1.005f + 0.05f;
      q.ba = b * ia, q.inv_ey2 = 1.0f / (eyw * eyw), q.hx0 = eyw * std::sqrt(a * c - b * b) * ia;
      q.slack = 0.05f + 1e-6f * (std::fabs(q.x) + eyw);
    }
  });
  return out;
}

// Prefetches rows ids[0 .. K) of a [*, C] float table (the tile's features). The kernels read a
// Gaussian's row once per (Gaussian, pixel row) segment, at an address known only then: for a table
// larger than L2 (e.g. 153k x 19 floats) each read waited for L3 or memory.
inline void prefetch_rows(const float* table, int64_t C, const int32_t* ids, int64_t K) {
  for (int64_t k = 0; k < K; ++k) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(table + (int64_t)ids[k] * C);
    for (uintptr_t line = first & ~uintptr_t(63); line < first + 4 * C; line += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(line));
  }
}

// The Gaussians of one tile in depth order (structure of arrays, index k = position in the tile), and which of
// them can reach alpha 1/255 on a pixel row, G = kNativeLanes Gaussians at a time as a bit mask (mask()).
//
// Filled lazily, G Gaussians at a time (ensure): a row's traversal reaches the next G Gaussians only when its
// pixels have not all ended, so the Gaussians behind every pixel of the tile are never gathered or tested (on the
// 512x512 viewer scene only 21 % of the tiles' Gaussians composite onto any pixel; gathering all of them and
// listing each on every row it crosses, as the kernels did before, was a third of the forward). Padded to whole
// groups with Gaussians that never reach 1/255 (ex = -1).
//
// The row test is exact per row, not per box: on row y the set sigma <= s (s = log(255 o), kSigmaSkip at most)
// is the interval x_c(y) +- hx0 sqrt(1 - dy^2 / ey_s^2) with x_c = mx + (b / a) dy, ey_s = sqrt(2 s a / det) the
// ellipse's half-height and hx0 = ey_s sqrt(det) / a; ey (the box, already rounded up) widened once more stands in
// for ey_s (no log per pair). Margins (ey * 1.005 + 0.05, half-width * 1.001 + 0.05 px + 1e-6 of the coordinates)
// keep it conservative against the float rounding of sigma: a pair it drops has alpha < 1/255 and would be skipped
// by the alpha rule anyway, so results are those of scanning every Gaussian (checked lane by lane on the real
// splats, where it drops 26-36 % of the box's (Gaussian, row) pairs).
struct TileGaussians {
  static constexpr int G = kNativeLanes;
  using S = Lanes<G>;
  int64_t K = 0, n_groups = 0, ready = 0;  // groups [0, ready) are filled
  // the PackedGaussian fields (structure of arrays, f[field][k]), then xg = mx - (x0 + 0.5) (x0: the tile's first
  // column) and the Gaussians' indices (ids) into the packed array
  std::vector<float> f[kPackedFields];
  std::vector<float> xg;
  std::vector<int32_t> id;
  std::vector<uint32_t> valid, degen;  // per group: can reach 1/255; degenerate conic (every row)
  const float *x, *y, *a, *b, *c, *o, *h, *hc, *z, *ba, *inv_ey2, *hx0, *slack;

  static int64_t group_of(int64_t k) { return k / G; }

  // Gaussians ids[0 .. K) of the packed array (ids: the tile's run of flatten_ids) in a tile whose first pixel
  // column is x0; their feature rows (table [*, C], if given) are prefetched ahead of their use.
  void begin(const PackedGaussian* pg, const int32_t* ids, int64_t K_, int64_t x0, const float* table = nullptr,
             int64_t C = 0) {
    pg_ = pg, ids_ = ids, table_ = table, C_ = C, xc0_ = (float)x0 + 0.5f;
    K = K_, n_groups = (K + G - 1) / G, ready = 0;
    const size_t Kp = (size_t)(n_groups * G);
    if (xg.size() < Kp) {
      for (auto& v : f) v.resize(Kp);
      xg.resize(Kp), id.resize(Kp), valid.resize(n_groups), degen.resize(n_groups);
    }
    x = f[0].data(), y = f[1].data(), a = f[2].data(), b = f[3].data(), c = f[4].data(), o = f[5].data();
    h = f[6].data(), hc = f[7].data(), z = f[8].data(), ba = f[10].data(), inv_ey2 = f[11].data();
    hx0 = f[12].data(), slack = f[13].data();
    prefetch_group(0), prefetch_group(1);
  }
  // Groups [0, g] filled (and one more: its records and feature rows are on their way when it is reached).
  void ensure(int64_t g) {
    if (g < ready) return;
    const int64_t g1 = std::min(n_groups, g + 2);
    for (; ready < g1; ++ready) {
      prefetch_group(ready + 2);
      fill(ready);
    }
  }

  // Bit i set for Gaussian G g + i (group g filled) if its alpha can reach 1/255 at a pixel centre of the row at
  // fy in the pixel columns [c0, c1] (absolute, c0 <= c1).
  uint32_t mask(int64_t g, float fy, float c0, float c1) const {
    const int64_t k = g * G;
    const vfn dy = loadn(y + k) - fy;
    const vfn rem = 1.0f - dy * dy * loadn(inv_ey2 + k);
    const vfn hw = loadn(hx0 + k) * sqrtn(rem < 0.0f ? splatn(0.0f) : rem) * 1.001f + loadn(slack + k);
    const vfn xc = loadn(x + k) + loadn(ba + k) * dy;
    vfn lo = ceiln(xc - hw - 0.5f), hi = floorn(xc + hw - 0.5f);
    lo = lo < c0 ? splatn(c0) : lo;
    hi = hi > c1 ? splatn(c1) : hi;
    const uint32_t hit = S::bits(S::le(splatn(0.0f), rem)) & S::bits(S::le(lo, hi));
    return (hit | degen[g]) & valid[g];
  }

 private:
  void prefetch_group(int64_t g) {
    if (g >= n_groups) return;
    const int64_t k0 = g * G, k1 = std::min(K, k0 + G);
    for (int64_t k = k0; k < k1; ++k) __builtin_prefetch(pg_ + ids_[k]);
    if (table_) prefetch_rows(table_, C_, ids_ + k0, k1 - k0);
  }
  // The G records of group g, transposed into the field arrays 8 x 8 floats at a time.
  void fill(int64_t g) {
    const int64_t k0 = g * G, n = std::min<int64_t>(G, K - k0);
    static const PackedGaussian kNone = {0, 0, 1, 0, 1, 0, 0.5f, 0.5f, 0, -1, 0, 0, 0, 0, 0, 0};
    for (int64_t j = 0; j < G; j += 8) {
      const PackedGaussian* r[8];
      for (int i = 0; i < 8; ++i) r[i] = j + i < n ? pg_ + ids_[k0 + j + i] : &kNone;
      for (int h8 = 0; h8 < kPackedFields; h8 += 8) {
        vf8 t[8];
        for (int i = 0; i < 8; ++i) t[i] = load8(&r[i]->x + h8);
        transpose8(t);
        for (int i = 0; i < 8; ++i) store8(f[h8 + i].data() + k0 + j, t[i]);
      }
    }
    for (int64_t i = 0; i < G; ++i) id[k0 + i] = i < n ? ids_[k0 + i] : 0;
    storen(xg.data() + k0, loadn(x + k0) - xc0_);
    const vfn kind = loadn(f[14].data() + k0);
    valid[g] = S::bits(S::le(splatn(0.5f), kind));
    degen[g] = S::bits(S::le(splatn(1.5f), kind));
  }
  const PackedGaussian* pg_ = nullptr;
  const int32_t* ids_ = nullptr;
  const float* table_ = nullptr;
  int64_t C_ = 0;
  float xc0_ = 0.0f;
};

// Tile `work` (camera-major flat index) of a [B, TH, TW] grid of tile_size tiles over H x W
// images: camera b, pixel rows [y0, y1) and columns [x0, x1) (clipped to the image).
struct TileRect {
  int64_t b, y0, y1, x0, x1;
};

inline TileRect tile_rect(int64_t work, int64_t TH, int64_t TW, int64_t tile_size, int64_t H, int64_t W) {
  const int64_t tile = work % (TH * TW), y0 = (tile / TW) * tile_size, x0 = (tile % TW) * tile_size;
  return {work / (TH * TW), y0, std::min<int64_t>(y0 + tile_size, H), x0, std::min<int64_t>(x0 + tile_size, W)};
}

// Front-to-back compositing of one pixel row of a tile, Gaussian-major, with a per-contribution callback (the
// aggregation; the forward rasterizer runs the same traversal with its own accumulators, rasterize.cpp): the
// row's pixels [0, nx) in units of Unit::W lanes, each unit over the Gaussians that TileGaussians::mask finds for
// its columns, in depth order. Pixel lanes l with limit[l] >= 0 are open (limit -1: closed), T[l] their transmittance (T and
// limit hold row_alpha_capacity(tile_size) lanes). For each Gaussian k that composites onto an open pixel of a
// unit: seg(k, pairs), where pairs(fn) calls fn(l, alpha, T) for each pixel it composites onto (alpha kept, pixel
// open), in pixel order, with T the transmittance in front of it; T[l] is then updated. A pixel whose T would
// fall to <= 1e-4 ends before this Gaussian. Per pixel: exactly a front-to-back scan. The recording forward
// records its contributions in this order (unit by unit), which the aggregation's replays rely on.
template <typename Segment>
inline void composite_row(TileGaussians& tg, float fy, int64_t x0, int64_t nx, float* T,
                          const int32_t* limit, Segment&& seg) {
  using S = Unit;
  using V = S::V;
  using M = S::M;
  constexpr int W = S::W;
  V iota;
  for (int l = 0; l < W; ++l) iota[l] = (float)l;
  for (int64_t u0 = 0; u0 < nx; u0 += W) {
    const int nu = (int)std::min<int64_t>(W, nx - u0);
    uint32_t open_bits = 0;
    for (int l = 0; l < nu; ++l) open_bits |= (uint32_t)(limit[u0 + l] >= 0) << l;
    if (!open_bits) continue;
    M open = S::from_bits(open_bits);
    V Tv = S::load(T + u0);
    const V px = iota + (float)u0;
    const float c0 = (float)(x0 + u0), c1 = (float)(x0 + u0 + nu - 1);
    for (int64_t g = 0; g < tg.n_groups && S::any(open); ++g) {
      tg.ensure(g);
      for (uint32_t m = tg.mask(g, fy, c0, c1); m && S::any(open); m &= m - 1) {
        const int64_t k = g * TileGaussians::G + std::countr_zero(m);
        const float dy = tg.y[k] - fy;
        V vis;
        M ok;
        const V al = alpha_kept<W>(tg.xg[k], tg.h[k], tg.hc[k] * dy * dy, tg.b[k] * dy, tg.o[k], px, ok, vis);
        const M live = ok & open;
        if (!S::any(live)) continue;
        const V next_T = Tv * (1.0f - al);
        const M ends = S::le(next_T, splat<V>(kTransmittanceMin)) & live;  // the pixel ends before this Gaussian
        open = S::andnot(ends, open);
        const M on = S::andnot(ends, live);
        alignas(64) float ab[W], tb[W];
        S::store(ab, al);
        S::store(tb, Tv);
        seg(k, [&](auto&& fn) {
          for (uint32_t q = S::bits(on); q; q &= q - 1) {
            const int l = std::countr_zero(q);
            fn((int64_t)(u0 + l), ab[l], tb[l]);
          }
        });
        Tv = S::blend(on, next_T, Tv);
      }
    }
    S::store(T + u0, Tv);
  }
}

}  // namespace rh3dgs
