// CPU tile binning: which Gaussians touch which 16x16 tiles, sorted front to back per tile.
// Same contract and rounding as gsplat's isect_tiles + isect_offset_encode (non-packed).
//
// One stable radix sort of the visible pairs by depth (in id order: the order of (depth, Gaussian id)),
// then a counting sort by (camera, tile) that keeps that order: O(G + M), parallel over bands of tile
// rows, deterministic.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "huge_alloc.h"

namespace rh3dgs {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> isect_tiles_cpu(const at::Tensor& means2d_, const at::Tensor& radii_,
                                                               const at::Tensor& depths_, int64_t tile_size,
                                                               int64_t tile_width, int64_t tile_height) {
  TORCH_CHECK(means2d_.dim() == 3 && means2d_.size(2) == 2, "means2d must be [B,N,2]");
  const int64_t B = means2d_.size(0), N = means2d_.size(1);
  TORCH_CHECK(radii_.sizes() == at::IntArrayRef({B, N}) && depths_.sizes() == at::IntArrayRef({B, N}),
              "radii and depths must be [B,N]");
  const auto means2d = means2d_.to(at::kFloat).contiguous();
  const auto radii = radii_.to(at::kInt).contiguous();
  const auto depths = depths_.to(at::kFloat).contiguous();
  const float* xy = means2d.data_ptr<float>();
  const int32_t* rad = radii.data_ptr<int32_t>();
  const float* dep = depths.data_ptr<float>();
  const int64_t G = B * N, n_tiles = tile_width * tile_height;
  const float ts = (float)tile_size;

  // The scratch arrays below are O(G) (~50 bytes per (Gaussian, camera)): on huge pages and kept for the next
  // call of the same size (huge_alloc.h), since paging in fresh ones cost as much as the binning itself.
  // tile rectangles (gsplat's rounding: floor / ceil of mean/ts -+ radius/ts, clamped)
  auto rect = huge_array<int32_t>((size_t)G * 4);
  auto tiles_per_gauss = empty_huge({B, N}, radii.options());
  int32_t* tpg = tiles_per_gauss.data_ptr<int32_t>();
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t g = 0; g < G; ++g) {
    int32_t* r = rect.get() + 4 * g;
    r[0] = r[1] = r[2] = r[3] = 0;
    tpg[g] = 0;
    if (rad[g] <= 0) continue;
    const float tx = xy[2 * g] / ts, ty = xy[2 * g + 1] / ts, tr = (float)rad[g] / ts;
    r[0] = std::min<int64_t>(std::max<int64_t>((int64_t)std::floor(tx - tr), 0), tile_width);
    r[1] = std::min<int64_t>(std::max<int64_t>((int64_t)std::floor(ty - tr), 0), tile_height);
    r[2] = std::min<int64_t>(std::max<int64_t>((int64_t)std::ceil(tx + tr), 0), tile_width);
    r[3] = std::min<int64_t>(std::max<int64_t>((int64_t)std::ceil(ty + tr), 0), tile_height);
    tpg[g] = (r[2] - r[0]) * (r[3] - r[1]);
  }
  // Depth order first: the visible (Gaussian, camera) pairs sorted by (depth, id), then dealt to their
  // tiles in that order, so every tile's run comes out sorted (ties by id, as the per-tile comparison
  // sort this replaces). The pairs are listed in id order and sorted stably by the depth's float bits
  // mapped to an order-preserving uint32 (an LSD radix sort, 3 passes of 11 bits, a pass skipped when
  // every key has the same digit): the order of a sort by (depth, id), in O(G) instead of O(G log G).
  auto ids = huge_array<uint32_t>(G), dkey = huge_array<uint32_t>(G);
  size_t K = 0;
  for (int64_t g = 0; g < G; ++g) {
    if (tpg[g] == 0) continue;
    uint32_t bits;
    std::memcpy(&bits, dep + g, 4);
    ids[K] = (uint32_t)g;
    dkey[K++] = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  }
  {
    auto ids2 = huge_array<uint32_t>(G), dkey2 = huge_array<uint32_t>(G);
    constexpr int kBits = 11, kBuckets = 1 << kBits;
    for (int shift = 0; shift < 32; shift += kBits) {
      std::vector<size_t> hist(kBuckets, 0);
      for (size_t i = 0; i < K; ++i) ++hist[(dkey[i] >> shift) & (kBuckets - 1)];
      if (K == 0 || hist[(dkey[0] >> shift) & (kBuckets - 1)] == K) continue;  // one digit: order unchanged
      size_t sum = 0;
      for (auto& h : hist) sum += std::exchange(h, sum);
      for (size_t i = 0; i < K; ++i) {
        const size_t at = hist[(dkey[i] >> shift) & (kBuckets - 1)]++;
        ids2[at] = ids[i], dkey2[at] = dkey[i];
      }
      std::swap(ids, ids2), std::swap(dkey, dkey2);
    }
  }
  // The pairs' tile rectangles in that order (the bands below scan them sequentially), their rows
  // as rows of all cameras' tile rows (camera-major: row b * TH + ty).
  struct Pair {
    int32_t g, x0, x1, y0, y1;
  };
  auto pairs = huge_array<Pair>(G);
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t i = 0; i < (int64_t)K; ++i) {
    const int64_t g = ids[i], row = g / N * tile_height;
    const int32_t* r = rect.get() + 4 * g;
    pairs[i] = {(int32_t)g, r[0], r[2], (int32_t)(row + r[1]), (int32_t)(row + r[3])};
  }
  dkey.reset(), ids.reset(), rect.reset();
  // The tile rows are split into bands, one per task; each band
  // counts and then fills only its own tiles, scanning the pairs in depth order
  // (deterministic for any thread count).
  const int64_t n_rows = B * tile_height;
  std::vector<int64_t> counts((size_t)B * n_tiles, 0);
  auto for_band = [&](int64_t row0, int64_t row1, auto&& fn) {
    for (const Pair* q = pairs.get(); q != pairs.get() + K; ++q) {
      const int64_t y1 = std::min<int64_t>(q->y1, row1);
      for (int64_t y = std::max<int64_t>(q->y0, row0); y < y1; ++y) {
        const int64_t base = y * tile_width;
        for (int32_t x = q->x0; x < q->x1; ++x) fn(base + x, q->g);
      }
    }
  };
  const int64_t grain = std::max<int64_t>(1, n_rows / std::max(1, at::get_num_threads()));
  at::parallel_for(0, n_rows, grain, [&](int64_t row0, int64_t row1) {
    for_band(row0, row1, [&](int64_t t, int64_t) { ++counts[t]; });
  });
  auto isect_offsets = at::empty({B, tile_height, tile_width}, radii.options());
  int32_t* offs = isect_offsets.data_ptr<int32_t>();
  std::vector<int64_t> cursor((size_t)B * n_tiles, 0);
  int64_t total = 0;
  for (int64_t t = 0; t < B * n_tiles; ++t) {
    cursor[t] = total;
    offs[t] = (int32_t)total;
    total += counts[t];
  }
  TORCH_CHECK(total < (int64_t)INT32_MAX, "too many tile intersections for int32 flatten_ids: ", total);
  auto flatten_ids = empty_huge({total}, radii.options());
  int32_t* fids = flatten_ids.data_ptr<int32_t>();
  at::parallel_for(0, n_rows, grain, [&](int64_t row0, int64_t row1) {
    for_band(row0, row1, [&](int64_t t, int64_t g) { fids[cursor[t]++] = (int32_t)g; });
  });
  return {tiles_per_gauss, isect_offsets, flatten_ids};
}

}  // namespace

TORCH_LIBRARY_IMPL(rh3dgs, CPU, m) { m.impl("isect_tiles", &isect_tiles_cpu); }

}  // namespace rh3dgs
