// CPU tile binning: which Gaussians touch which 16x16 tiles, sorted front to back per tile.
// Same contract and rounding as gsplat's isect_tiles + isect_offset_encode (non-packed).
//
// One sort of the visible pairs by (depth, Gaussian id), then a counting sort by (camera, tile)
// that keeps that order: O(G log G + M), parallel over bands of tile rows, deterministic.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

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

  // tile rectangles (gsplat's rounding: floor / ceil of mean/ts -+ radius/ts, clamped)
  std::vector<int32_t> rect((size_t)G * 4);
  auto tiles_per_gauss = at::zeros({B, N}, radii.options());
  int32_t* tpg = tiles_per_gauss.data_ptr<int32_t>();
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t g = 0; g < G; ++g) {
    int32_t* r = rect.data() + 4 * g;
    r[0] = r[1] = r[2] = r[3] = 0;
    if (rad[g] <= 0) continue;
    const float tx = xy[2 * g] / ts, ty = xy[2 * g + 1] / ts, tr = (float)rad[g] / ts;
    r[0] = std::min<int64_t>(std::max<int64_t>((int64_t)std::floor(tx - tr), 0), tile_width);
    r[1] = std::min<int64_t>(std::max<int64_t>((int64_t)std::floor(ty - tr), 0), tile_height);
    r[2] = std::min<int64_t>(std::max<int64_t>((int64_t)std::ceil(tx + tr), 0), tile_width);
    r[3] = std::min<int64_t>(std::max<int64_t>((int64_t)std::ceil(ty + tr), 0), tile_height);
    tpg[g] = (r[2] - r[0]) * (r[3] - r[1]);
  }
  // Depth order first: one sort of the visible (Gaussian, camera) pairs by (depth, id), then the
  // pairs are dealt to their tiles in that order, so every tile's run comes out sorted (ties by
  // id, as the per-tile comparison sort this replaces). Keys: the depth's float bits mapped to
  // an order-preserving uint32, then the flat id.
  std::vector<uint64_t> keys;
  keys.reserve(G);
  for (int64_t g = 0; g < G; ++g) {
    if (tpg[g] == 0) continue;
    uint32_t bits;
    std::memcpy(&bits, dep + g, 4);
    bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    keys.push_back(((uint64_t)bits << 32) | (uint32_t)g);
  }
  std::sort(keys.begin(), keys.end());
  // Tile rows (camera-major: row b * TH + ty) are split into bands, one per task; each band
  // counts and then fills only its own tiles, scanning the pairs in depth order
  // (deterministic for any thread count).
  const int64_t n_rows = B * tile_height;
  std::vector<int64_t> counts((size_t)B * n_tiles, 0);
  auto for_band = [&](int64_t row0, int64_t row1, auto&& fn) {
    for (const uint64_t key : keys) {
      const int64_t g = (int64_t)(key & 0xffffffffu);
      const int32_t* r = rect.data() + 4 * g;
      const int64_t b = g / N;
      const int64_t y0 = std::max<int64_t>(r[1], row0 - b * tile_height);
      const int64_t y1 = std::min<int64_t>(r[3], row1 - b * tile_height);
      for (int64_t y = y0; y < y1; ++y) {
        const int64_t base = (b * tile_height + y) * tile_width;
        for (int32_t x = r[0]; x < r[2]; ++x) fn(base + x, g);
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
  auto flatten_ids = at::empty({total}, radii.options());
  int32_t* fids = flatten_ids.data_ptr<int32_t>();
  at::parallel_for(0, n_rows, grain, [&](int64_t row0, int64_t row1) {
    for_band(row0, row1, [&](int64_t t, int64_t g) { fids[cursor[t]++] = (int32_t)g; });
  });
  return {tiles_per_gauss, isect_offsets, flatten_ids};
}

}  // namespace

TORCH_LIBRARY_IMPL(rh3dgs, CPU, m) { m.impl("isect_tiles", &isect_tiles_cpu); }

}  // namespace rh3dgs
