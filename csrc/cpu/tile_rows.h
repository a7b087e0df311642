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
#include "row_alpha.h"
#include "vec16.h"

namespace rh3dgs {

// One Gaussian of one view as the CPU kernels read it: 2D mean, conic, opacity and the
// half-widths (ex, ey) of the box outside which its alpha < 1/255 (ex = -1: it never reaches
// 1/255; 1e30: degenerate conic, no culling). One 32-byte record, so gathering a tile's
// Gaussians costs one cache line each instead of one per input array.
struct PackedGaussian {
  float x, y, a, b, c, o, ex, ey;
};

// Packs n Gaussians (means2d [n,2], conics [n,3], opacities [n]) with their extents, in
// parallel: per Gaussian once, not per tile intersection.
inline std::vector<PackedGaussian> pack_gaussians(int64_t n, const float* xy, const float* con, const float* opac) {
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
      out[g] = {xy[2 * g], xy[2 * g + 1], a, b, c, o, ex, ey};
    }
  });
  return out;
}

// The Gaussians of one tile in depth order (structure of arrays, index k = position in the tile).
struct TileGaussians {
  std::vector<float> x, y, a, b, c, o, ex, ey;

  // Gaussians flatten_ids[start .. start + K) of the packed array.
  void gather(const PackedGaussian* pg, const int32_t* fids, int64_t start, int64_t K) {
    for (auto* v : {&x, &y, &a, &b, &c, &o, &ex, &ey}) v->resize(K);
    for (int64_t k = 0; k < K; ++k) {
      const PackedGaussian& g = pg[fids[start + k]];
      x[k] = g.x; y[k] = g.y; a[k] = g.a; b[k] = g.b; c[k] = g.c; o[k] = g.o; ex[k] = g.ex; ey[k] = g.ey;
    }
  }
};

// Prefetches rows ids[0 .. K) of a [*, C] float table (the tile's features). The kernels read a
// Gaussian's row once per (Gaussian, pixel row) segment, at an address known only then: for a table
// larger than L2 (e.g. 153k x 19 floats) each read waited for L3 or memory. Issued in one stream
// while the tile is gathered, the fetches overlap.
inline void prefetch_rows(const float* table, int64_t C, const int32_t* ids, int64_t K) {
  for (int64_t k = 0; k < K; ++k) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(table + (int64_t)ids[k] * C);
    for (uintptr_t line = first & ~uintptr_t(63); line < first + 4 * C; line += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(line));
  }
}

// Tile `work` (camera-major flat index) of a [B, TH, TW] grid of tile_size tiles over H x W
// images: camera b, pixel rows [y0, y1) and columns [x0, x1) (clipped to the image).
struct TileRect {
  int64_t b, y0, y1, x0, x1;
};

inline TileRect tile_rect(int64_t work, int64_t TH, int64_t TW, int64_t tile_size, int64_t H, int64_t W) {
  const int64_t tile = work % (TH * TW), y0 = (tile / TW) * tile_size, x0 = (tile % TW) * tile_size;
  return {work / (TH * TW), y0, std::min<int64_t>(y0 + tile_size, H), x0, std::min<int64_t>(x0 + tile_size, W)};
}

struct TileRows {
  // The lists are built lazily, a chunk of kChunk Gaussians (in depth order) at a time, when a row's
  // traversal first reaches the chunk (ensure): on dense scenes most of a tile's Gaussians lie behind pixels
  // that have already ended and no row ever reaches them (the viewer scene at 512x512: 21 % of the tiles'
  // Gaussians composite onto any pixel, and listing all of them for every row was a quarter of the forward).
  // Row r's list within chunk c is items[(c * rows + r) * kChunk .. + count[c * rows + r]) (k ascending),
  // with per item the first / last pixel (lane) of the row it can reach.
  static constexpr int64_t kChunk = 64;
  int64_t K = 0, rows = 0, n_chunks = 0, built = 0;  // chunks [0, built) are listed
  std::vector<int32_t> count;
  std::vector<int32_t> items;
  std::vector<uint8_t> lane_lo, lane_hi;

  int64_t chunk_of(int64_t k) const { return k / kChunk; }
  int64_t list(int64_t c, int64_t r) const { return c * rows + r; }  // index of row r's list in chunk c
  const int32_t* row(int64_t c, int64_t r) const { return items.data() + list(c, r) * kChunk; }
  int64_t row_size(int64_t c, int64_t r) const { return count[list(c, r)]; }
  int64_t row_offset(int64_t c, int64_t r) const { return list(c, r) * kChunk; }  // index of the list's first item

  // The tile's Gaussians t (K of them); rows y0 .. y1-1 and columns x0 .. x1-1 of the image. Nothing is
  // listed yet: ensure(c) lists chunks [0, c].
  void begin(const TileGaussians& t, int64_t y0, int64_t y1, int64_t x0, int64_t x1) {
    tg_ = &t, y0_ = y0, x0_ = x0, x1_ = x1;
    K = (int64_t)t.x.size(), rows = y1 - y0, n_chunks = (K + kChunk - 1) / kChunk, built = 0;
    const size_t n = (size_t)(n_chunks * rows);
    if (count.size() < n) count.resize(n);
    if (items.size() < n * kChunk) {
      items.resize(n * kChunk); lane_lo.resize(n * kChunk); lane_hi.resize(n * kChunk);
    }
  }
  void ensure(int64_t c) {
    for (; built <= c && built < n_chunks; ++built) build(built);
  }

  // Lists chunk c: a Gaussian is listed on a row if its alpha can reach 1/255 at a pixel centre of that row
  // inside the tile's columns, with the lanes [lane_lo, lane_hi] that can. The test is exact
  // per row, not per box: on row y the set sigma <= s (s = log(255 o), kSigmaSkip at most) is the
  // interval x_c(y) +- hx0 sqrt(1 - dy^2 / ey^2) with x_c = mx + (b / a) dy (see below).
  // Margins (the box's ey * 1.005 + 0.05, half-width * 1.001 + 0.05 px + 1e-6 of the coordinates)
  // keep it conservative against the float rounding of sigma, so results are those of scanning
  // every Gaussian (checked lane by lane on the real splats). Rows are tested 8 or 16 at a time. On real splats this
  // drops 26-36 % of the box's (Gaussian, row) pairs, and 70 % of the rest fit in half a row.
  void build(int64_t ch) {
    const TileGaussians& t = *tg_;
    const int64_t y0 = y0_, y1 = y0_ + rows, x0 = x0_, x1 = x1_;
    const float *lx = t.x.data(), *ly = t.y.data(), *lex = t.ex.data(), *ley = t.ey.data();
    int32_t* cnt = count.data() + ch * rows;
    std::fill(cnt, cnt + rows, 0);
    const auto add = [&](int64_t r, int64_t k, int lo, int hi) {
      const int64_t j = (ch * rows + r) * kChunk + cnt[r]++;
      items[j] = (int32_t)k; lane_lo[j] = (uint8_t)lo; lane_hi[j] = (uint8_t)hi;
    };
    const float xmin = (float)x0, xmax = (float)(x1 - 1);
    vfn iota;
    for (int l = 0; l < kNativeLanes; ++l) iota[l] = (float)l;
    for (int64_t k = ch * kChunk; k < std::min(K, (ch + 1) * kChunk); ++k) {
      const float ex = lex[k], ey = ley[k];
      if (!(ex >= 0.0f)) continue;  // never reaches alpha 1/255
      // columns whose centre (px + 0.5) lies in [lx - ex, lx + ex]
      const double c0 = std::ceil((double)(lx[k] - ex) - 0.5), c1 = std::floor((double)(lx[k] + ex) - 0.5);
      if (std::max((double)x0, std::max(c0, -1e15)) > std::min((double)(x1 - 1), std::min(c1, 1e15))) continue;
      // rows whose centre (py + 0.5) lies in [ly - ey, ly + ey]
      const double r0 = std::ceil((double)ly[k] - ey - 0.5), r1 = std::floor((double)ly[k] + ey - 0.5);
      const int64_t a0 = std::max<int64_t>(y0, (int64_t)std::max(r0, -1e15)) - y0;
      const int64_t a1 = std::min<int64_t>(y1 - 1, (int64_t)std::min(r1, 1e15)) - y0;
      if (a0 > a1) continue;
      if (!(ex < 1e29f)) {  // degenerate conic: every lane of every row of the box
        for (int64_t r = a0; r <= a1; ++r) add(r, k, 0, (int)(x1 - 1 - x0));
        continue;
      }
      // The ellipse sigma <= s has half-height ey_s = sqrt(2 s a / det) and, on the row at dy,
      // half-width hx0 sqrt(1 - dy^2 / ey_s^2) around x_c = mx + (b / a) dy, hx0 = ey_s sqrt(det) / a.
      // ey (the box, already rounded up) widened once more stands in for ey_s: no log per pair.
      const float a = t.a[k], b = t.b[k], c = t.c[k];
      const float ia = 1.0f / a, ba = b * ia, mx = lx[k];
      const float eyw = ey * 1.005f + 0.05f, inv_ey2 = 1.0f / (eyw * eyw);
      const float hx0 = eyw * std::sqrt(a * c - b * b) * ia;
      const float slack = 0.05f + 1e-6f * (std::fabs(mx) + eyw);
      // the box's rows, kNativeLanes at a time: interval per row, then the hits appended in order
      for (int64_t rb = a0; rb <= a1; rb += kNativeLanes) {
        const vfn r = iota + (float)rb;
        const vfn dy = ly[k] - ((float)y0 + 0.5f + r);
        const vfn rem = 1.0f - dy * dy * inv_ey2;
        const vfn hw = hx0 * sqrtn(rem < 0.0f ? splatn(0.0f) : rem) * 1.001f + slack;
        const vfn xc = mx + ba * dy;
        vfn lo = ceiln(xc - hw - 0.5f), hi = floorn(xc + hw - 0.5f);
        lo = lo < xmin ? splatn(xmin) : lo;
        hi = hi > xmax ? splatn(xmax) : hi;
        const int64_t m = std::min<int64_t>(kNativeLanes, a1 - rb + 1);
        for (int l = 0; l < m; ++l) {
          if (rem[l] >= 0.0f && lo[l] <= hi[l]) add(rb + l, k, (int)(lo[l] - xmin), (int)(hi[l] - xmin));
        }
      }
    }
  }

 private:
  const TileGaussians* tg_ = nullptr;
  int64_t y0_ = 0, x0_ = 0, x1_ = 0;
};

// Front-to-back compositing of one pixel row of a tile, Gaussian-major (forward rasterizer and
// aggregation). Pixel lanes l < L with limit[l] >= 0 are open (INT32_MAX; -1 = closed or
// padding), T[l] their transmittance. For each Gaussian k of the row, in depth order, while
// fewer than n_open pixels have ended: seg(k, pairs), where pairs(fn) calls fn(l, alpha, T)
// for each pixel the Gaussian composites onto (alpha kept, pixel open), in pixel order, with T
// the transmittance in front of it; T[l] is then updated. A pixel whose T would fall to
// <= 1e-4 ends before this Gaussian (limit -1). Per pixel: exactly a front-to-back scan.
template <typename Segment>
inline void composite_row(const TileGaussians& tg, TileRows& rows, int64_t r, float fy, int64_t x0, int64_t L,
                          int64_t n_open, float* T, int32_t* limit, float* alpha, float* vis, Segment&& seg) {
  int64_t n_done = 0;
  for (int64_t ch = 0; ch < rows.n_chunks && n_done < n_open; ++ch) {
    rows.ensure(ch);
    const int32_t* row = rows.row(ch, r);
    const int64_t n_row = rows.row_size(ch, r);
    const int64_t i0 = rows.row_offset(ch, r);
    for (int64_t j = 0; j < n_row && n_done < n_open; ++j) {
      const int64_t k = row[j];
      row_alphas_span(tg.x[k], tg.y[k], tg.a[k], tg.b[k], tg.c[k], tg.o[k], fy, x0, L, rows.lane_lo[i0 + j],
                      rows.lane_hi[i0 + j], alpha, vis);
      uint64_t mask = lane_mask(alpha, limit, (int32_t)k, L);
      if (mask == 0) continue;
      auto pairs = [&](auto&& fn) {
        for (; mask; mask &= mask - 1) {
          const int64_t l = std::countr_zero(mask);
          const float a = alpha[l];
          const float next_T = T[l] * (1.0f - a);
          if (next_T <= kTransmittanceMin) {  // the pixel ends before this Gaussian
            limit[l] = -1;
            ++n_done;
            continue;
          }
          fn(l, a, T[l]);
          T[l] = next_T;
        }
      };
      seg(k, pairs);
    }
  }
}

}  // namespace rh3dgs
