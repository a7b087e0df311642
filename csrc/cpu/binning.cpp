// CPU tile binning: which Gaussians touch which 16x16 tiles, sorted front to back per tile.
// Same contract and rounding as gsplat's isect_tiles + isect_offset_encode (non-packed).
//
// Counting sort by (camera, tile), then a per-tile sort by (depth, Gaussian id): O(M) plus
// small sorts, parallel over tiles, and deterministic (ties in depth broken by id).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
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
  // counting sort by global tile (camera * n_tiles + tile)
  std::vector<int64_t> counts((size_t)B * n_tiles + 1, 0);
  for (int64_t g = 0; g < G; ++g) {
    const int32_t* r = rect.data() + 4 * g;
    const int64_t base = (g / N) * n_tiles;
    for (int32_t y = r[1]; y < r[3]; ++y)
      for (int32_t x = r[0]; x < r[2]; ++x) ++counts[base + y * tile_width + x];
  }
  auto isect_offsets = at::empty({B, tile_height, tile_width}, radii.options());
  int32_t* offs = isect_offsets.data_ptr<int32_t>();
  std::vector<int64_t> cursor((size_t)B * n_tiles + 1, 0);
  int64_t total = 0;
  for (int64_t t = 0; t < B * n_tiles; ++t) {
    cursor[t] = total;
    offs[t] = (int32_t)total;
    total += counts[t];
  }
  cursor[B * n_tiles] = total;
  TORCH_CHECK(total < (int64_t)INT32_MAX, "too many tile intersections for int32 flatten_ids: ", total);
  auto flatten_ids = at::empty({total}, radii.options());
  int32_t* fids = flatten_ids.data_ptr<int32_t>();
  for (int64_t g = 0; g < G; ++g) {  // in Gaussian order
    const int32_t* r = rect.data() + 4 * g;
    const int64_t base = (g / N) * n_tiles;
    for (int32_t y = r[1]; y < r[3]; ++y)
      for (int32_t x = r[0]; x < r[2]; ++x) fids[cursor[base + y * tile_width + x]++] = (int32_t)g;
  }
  // front to back inside each tile
#pragma omp parallel for schedule(dynamic, 4) num_threads(at::get_num_threads())
  for (int64_t t = 0; t < B * n_tiles; ++t) {
    int32_t* begin = fids + offs[t];
    int32_t* end = fids + (t + 1 < B * n_tiles ? (int64_t)offs[t + 1] : total);
    std::sort(begin, end, [dep](int32_t a, int32_t b) { return dep[a] < dep[b] || (dep[a] == dep[b] && a < b); });
  }
  return {tiles_per_gauss, isect_offsets, flatten_ids};
}

}  // namespace

TORCH_LIBRARY_IMPL(rh3dgs, CPU, m) { m.impl("isect_tiles", &isect_tiles_cpu); }

}  // namespace rh3dgs
