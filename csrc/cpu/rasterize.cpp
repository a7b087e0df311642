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
#include "tile_rows.h"

namespace rh3dgs {
namespace {

void check_inputs(const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& features,
                  const at::Tensor& opacities, const at::Tensor& depths, const c10::optional<at::Tensor>& backgrounds,
                  const at::Tensor& isect_offsets, const at::Tensor& flatten_ids, int64_t tile_size) {
  // one bit per pixel of a tile row in lane_mask()
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
  const std::vector<PackedGaussian> packed = pack_gaussians(B * N, xy, con, opac);
#pragma omp parallel num_threads(at::get_num_threads())
  {
    ThreadRecord* rec = nullptr;
    if constexpr (REC) {  // ~3.3 contributions per intersection on dense scenes: avoid regrowing
      rec = &(*records)[omp_get_thread_num()];
      rec->reserve((size_t)(4 * n_isects / omp_get_num_threads()));
    }
    TileGaussians tg;  // the tile's Gaussians (structure of arrays)
    std::vector<float> lz;  // and their depths
    // Per-row state, one lane per pixel of the tile row (L lanes, lanes >= nx are padding).
    const int64_t L = row_alpha_capacity(tile_size);
    std::vector<float> rT(L), rd1(L), rd2(L), racc(CT > 0 ? 0 : L * C), ralpha(L), rvis(L);  // racc: [L][C]
    RowAccum<(CT > 0 ? CT : 1)> acc(CT > 0 ? L : 0);  // compiled channel counts
    std::vector<int32_t> rlast(L), rlimit(L);  // rlimit: INT32_MAX while the pixel is open, else -1
    TileRows rows;
    auto tile = [&](int64_t work) {
      if constexpr (REC) rec->begin_tile(work);
      const auto [b, y0, y1, x0, x1] = tile_rect(work, TH, TW, tile_size, height, width);
      int64_t start, end;
      tile_bounds(offsets, work, n_work, n_isects, start, end);
      const int64_t K = end - start;
      tg.gather(packed.data(), fids, start, K);
      lz.resize(K);
      for (int64_t k = 0; k < K; ++k) lz[k] = dep[fids[start + k]];
      prefetch_rows(feat, C, fids + start, K);
      rows.begin(tg, y0, y1, x0, x1);
      const int64_t nx = x1 - x0;
      for (int64_t py = y0; py < y1; ++py) {
        // Gaussian-major over this row (composite_row); per pixel the operations and their
        // order are those of a front-to-back scan.
        const float fy = (float)py + 0.5f;
        for (int64_t l = 0; l < L; ++l) {
          rT[l] = 1.0f; rd1[l] = rd2[l] = 0.0f; rlast[l] = -1;
          rlimit[l] = l < nx ? std::numeric_limits<int32_t>::max() : -1;
        }
        if constexpr (CT > 0) acc.clear(); else std::fill(racc.begin(), racc.end(), 0.0f);
        composite_row(tg, rows, py - y0, fy, x0, L, nx, rT.data(), rlimit.data(), ralpha.data(), rvis.data(),
                      [&](int64_t k, auto&& pairs) {
                        const float z = lz[k];
                        const float* f = feat + (int64_t)fids[start + k] * C;
                        const int32_t id = (int32_t)(start + k);
                        const auto fr = decltype(acc)::load(CT > 0 ? f : feat);
                        const size_t n_before = REC ? rec->w.size() : 0;
                        uint8_t* rec_lane = nullptr;  // REC: the cursors of this segment's contributions
                        float *rec_w = nullptr, *rec_mass = nullptr;
                        if constexpr (REC) {
                          rec->make_room((size_t)L);
                          rec_lane = rec->lane.end(), rec_w = rec->w.end(), rec_mass = rec->mass.end();
                        }
                        pairs([&](int64_t l, float a, float T) {
                          const float w = a * T;
                          if constexpr (CT > 0) acc.add(l, w, fr);
                          else axpy<CT>(racc.data() + l * C, w, f, C);
                          rd1[l] += w * z;
                          rd2[l] += w * z * z;
                          rlast[l] = id;
                          if constexpr (REC) *rec_lane++ = (uint8_t)l, *rec_w++ = w, *rec_mass++ = a;
                        });
                        if constexpr (REC) {
                          rec->commit((size_t)(rec_w - rec->w.end()));
                          rec->close_segment(n_before, fids[start + k] % N, (b * height + py) * width + x0);
                        }
                      });
        for (int64_t q = 0; q < nx; ++q) {
          const int64_t pix = (b * height + py) * width + x0 + q;
          float* o = out + pix * C;
          if constexpr (CT > 0) {
            acc.store(q, o, bg ? bg + b * C : nullptr, rT[q]);
          } else {
            const float* ac = racc.data() + q * C;
            for (int64_t c = 0; c < C; ++c) o[c] = ac[c] + (bg ? rT[q] * bg[b * C + c] : 0.0f);
          }
          out_a[pix] = 1.0f - rT[q];
          out_d1[pix] = rd1[q];
          out_d2[pix] = rd2[q];
          out_last[pix] = rlast[q];
        }
      }
    };
#pragma omp for schedule(dynamic, 1)
    for (int64_t work = 0; work < n_work; ++work) tile(work);
  }
  return {render, alpha, d1, d2, last_ids};
}

// One (Gaussian, pixel) pair of the backward over channels [0, n) (n = CT when known at compile time): adds
// the features' gradient w v_out to gf, the pair's weight to the behind-sums buf, and returns the channels'
// share of d loss / d alpha, sum_c (f_c T - buf_c / (1 - alpha)) v_out_c (prod: n floats of scratch).
template <int CT>
inline float channels_bwd(float* __restrict gf, float* __restrict prod, float* __restrict buf,
                          const float* __restrict f, const float* __restrict v_out, float w, float T, float ra,
                          int64_t n_rt) {
  const int64_t n = CT > 0 ? CT : n_rt;
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) {
    gf[c] += w * v_out[c];
    prod[c] = (f[c] * T - buf[c] * ra) * v_out[c];
    buf[c] += f[c] * w;
  }
  return tree_sum<CT>(prod, n);
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
  const bool geo_all = CG == C;
  // A compiled channel count is kHead scalar channels then kBlocks 16-float blocks (RGB + 16 latents: 3 + 1).
  constexpr int kHead = CT > 0 ? CT % 16 : 0, kBlocks = CT > 0 ? CT / 16 : 0;
  // v16: whole blocks only, all shaping the geometry: every channel in registers. split: the geometry
  // channels are exactly the head (channels_bwd<kHead>), the blocks need only their feature gradients
  // (in registers). Either way the blocks' feature gradients are gb below.
  const bool v16 = kHead == 0 && kBlocks > 0 && geo_all;
  const bool split = kHead > 0 && kBlocks > 0 && CG == kHead;
  // otherwise, with a compiled count, the two common geometry splits get compile-time trip counts too:
  // RGB + latents (CG = 3, e.g. rh3dgs-lite's 3 + 8) and latents alone (CG = 0)
  constexpr int64_t kRGB = 3;
  constexpr bool kRGB8 = CT == kRGB + 8;
  const int64_t TH = isect_offsets.size(1), TW = isect_offsets.size(2);
  const int64_t n_isects = flatten_ids.numel();
  // Per-intersection gradient rows: [xy(2), conic(3), opacity(1), depth(1), features(C)].
  const int64_t S = 7 + C;
  // Zeroed per tile inside the parallel loop (every intersection belongs to exactly one tile).
  const auto isect_grad = huge_array<float>((size_t)n_isects * S);

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
  const std::vector<PackedGaussian> packed = pack_gaussians(B * N, xy, con, opac);
#pragma omp parallel num_threads(at::get_num_threads())
  {
    TileGaussians tg;  // the tile's Gaussians (structure of arrays)
    // Per-row state, one SIMD lane per pixel of the tile row (L lanes, lanes >= nx are padding
    // with no contributor and zero gradients).
    const int64_t L = row_alpha_capacity(tile_size);
    std::vector<float> rT(L), rTf(L), rbg(L), rb1(L), rb2(L), rvd1(L), rvd2(L), rva(L);
    std::vector<float> ralpha(L), rvis(L), rra(L), rgf(C), rprod(C);
    std::vector<float> rbuf(L * C);  // [L][C]: features composited behind, per pixel
    std::vector<int32_t> rlastk(L);
    TileRows rows;
#pragma omp for schedule(dynamic, 1)
    for (int64_t work = 0; work < n_work; ++work) {
      int64_t start, end;
      tile_bounds(offsets, work, n_work, n_isects, start, end);
      if (end <= start) continue;
      const auto [b, y0, y1, x0, x1] = tile_rect(work, TH, TW, tile_size, height, width);
      const int64_t K = end - start;
      std::fill(isect_grad.get() + start * S, isect_grad.get() + end * S, 0.0f);
      tg.gather(packed.data(), fids, start, K);
      prefetch_rows(feat, C, fids + start, K);
      rows.begin(tg, y0, y1, x0, x1);
      const int64_t nx = x1 - x0;
      for (int64_t py = y0; py < y1; ++py) {
        // Gaussian-major, back to front over this row, all pixels at once; per pixel the same
        // operations in the same order as a back-to-front scan from its last contributor.
        const float fy = (float)py + 0.5f;
        const int64_t pix0 = (b * height + py) * width + x0;
        const float* v_row = vr + pix0 * C;  // [nx][C], pixel-major
        int64_t active = 0;
        for (int64_t l = 0; l < L; ++l) {
          rlastk[l] = -1;
          rTf[l] = 1.0f; rbg[l] = rvd1[l] = rvd2[l] = rva[l] = 0.0f;
          if (l >= nx) continue;
          const int64_t pix = pix0 + l;
          const int64_t last = lasts[pix];
          rlastk[l] = last < start ? -1 : (int32_t)(last - start);
          active += rlastk[l] >= 0;
          rTf[l] = 1.0f - A[pix];
          rvd1[l] = vd1[pix]; rvd2[l] = vd2[pix]; rva[l] = va[pix];
          const float* v_out = v_row + l * C;
          float bg_dot = 0.0f;
          if (bg) for (int64_t c = 0; c < CG; ++c) bg_dot += bg[b * C + c] * v_out[c];
          rbg[l] = bg_dot;
        }
        if (active == 0) continue;
        for (int64_t l = 0; l < L; ++l) { rT[l] = rTf[l]; rb1[l] = rb2[l] = 0.0f; }
        std::fill(rbuf.begin(), rbuf.end(), 0.0f);
        // Gaussians behind every pixel's last contributor add nothing: start at the last that can
        const int32_t max_last = *std::max_element(rlastk.begin(), rlastk.end());
        rows.ensure(rows.chunk_of(max_last));
        for (int64_t ch = rows.chunk_of(max_last); ch >= 0; --ch)
        for (int64_t j = rows.row_size(ch, py - y0) - 1; j >= 0; --j) {
          const int64_t k = rows.row(ch, py - y0)[j];
          if (k > max_last) continue;
          const int64_t isect = start + k;
          const int64_t g = fids[isect];
          const float a_ = tg.a[k], b_ = tg.b[k], c_ = tg.c[k], o = tg.o[k];
          const float z = dep[g];
          const float* f = feat + g * C;
          float* grow = isect_grad.get() + (size_t)isect * S;
          const int64_t item = rows.row_offset(ch, py - y0) + j;
          row_alphas_span(tg.x[k], tg.y[k], a_, b_, c_, o, fy, x0, L, rows.lane_lo[item], rows.lane_hi[item],
                          ralpha.data(), rvis.data());
          // the pixels this pair contributes to: alpha kept, not behind the pixel's last contributor
          uint64_t mask = lane_mask(ralpha.data(), rlastk.data(), (int32_t)k, L);
          if (mask == 0) continue;
#pragma omp simd
          for (int64_t l = 0; l < L; ++l) rra[l] = 1.0f / (1.0f - ralpha[l]);  // vector divide, all lanes
          const float dy = tg.y[k] - fy, mx0 = tg.x[k] - ((float)x0 + 0.5f);
          // d features of this pair's Gaussian: the blocks' in registers (v16, split), the rest in gf
          vf16 gb[kBlocks > 0 ? kBlocks : 1] = {};
          vf8 g8{};  // RGB + 8 latents with RGB shaping the geometry (rh3dgs-lite): the latents' d features
          float* gf = rgf.data();
          if (!v16) std::fill(gf, gf + (split ? kHead : C), 0.0f);
          float g0 = 0.0f, g1 = 0.0f, g2 = 0.0f, g3 = 0.0f, g4 = 0.0f, g5 = 0.0f, g6 = 0.0f;
          for (; mask; mask &= mask - 1) {
            const int64_t l = std::countr_zero(mask);
            const float a = ralpha[l], vis = rvis[l];
            const float ra = rra[l];
            rT[l] *= ra;  // transmittance in front of this Gaussian
            const float T = rT[l];
            const float w = a * T;
            const float* v_out = v_row + l * C;
            float* buf = rbuf.data() + l * C;
            // v_a (d loss / d alpha) from the features: sum_c (f_c T - behind_c / (1 - a)) v_out_c
            float v_a;
            if (v16) {
              vf16 acc{};
              for (int u = 0; u < kBlocks; ++u) {
                const vf16 vo = load16(v_out + 16 * u), fu = load16(f + 16 * u), bu = load16(buf + 16 * u);
                gb[u] += w * vo;
                acc += (fu * T - bu * ra) * vo;
                store16(buf + 16 * u, bu + fu * w);
              }
              v_a = hsum16(acc);
            } else if (geo_all) {
              v_a = channels_bwd<CT>(gf, rprod.data(), buf, f, v_out, w, T, ra, C);
            } else if (split) {
              v_a = channels_bwd<kHead>(gf, rprod.data(), buf, f, v_out, w, T, ra, kHead);
              for (int u = 0; u < kBlocks; ++u) gb[u] += w * load16(v_out + kHead + 16 * u);
            } else if (CT > 0 && CG == kRGB) {  // RGB shapes the geometry, the latents only their features
              v_a = channels_bwd<kRGB>(gf, rprod.data(), buf, f, v_out, w, T, ra, kRGB);
              if constexpr (kRGB8) {  // in a register, not through gf in memory per pair
                g8 += w * load8(v_out + kRGB);
              } else {
#pragma omp simd
                for (int64_t c = kRGB; c < (CT > 0 ? CT : C); ++c) gf[c] += w * v_out[c];
              }
            } else if (CT > 0 && CG == 0) {  // features alone on fixed geometry (distill)
              v_a = 0.0f;
#pragma omp simd
              for (int64_t c = 0; c < (CT > 0 ? CT : C); ++c) gf[c] += w * v_out[c];
            } else {  // the first CG channels as above; the others need only their feature gradient
              v_a = channels_bwd<0>(gf, rprod.data(), buf, f, v_out, w, T, ra, CG);
#pragma omp simd
              for (int64_t c = CG; c < C; ++c) gf[c] += w * v_out[c];
            }
            const float v_D1 = rvd1[l], v_D2 = rvd2[l];
            v_a += (z * T - rb1[l] * ra) * v_D1 + (z * z * T - rb2[l] * ra) * v_D2;
            v_a += rTf[l] * ra * (rva[l] - rbg[l]);
            g6 += w * (v_D1 + 2.0f * z * v_D2);
            rb1[l] += z * w;
            rb2[l] += z * z * w;
            if (o * vis <= kAlphaMax) {  // a clamped alpha has no gradient w.r.t. opacity and sigma
              const float v_sigma = -o * vis * v_a;
              const float dx = mx0 - (float)l;
              g0 += v_sigma * (a_ * dx + b_ * dy);
              g1 += v_sigma * (b_ * dx + c_ * dy);
              g2 += 0.5f * v_sigma * dx * dx;
              g3 += v_sigma * dx * dy;
              g4 += 0.5f * v_sigma * dy * dy;
              g5 += vis * v_a;
            }
          }
          if (v16 || split) {
            for (int c = 0; c < kHead; ++c) grow[7 + c] += gf[c];  // split's head (v16: kHead = 0)
            float* gblk = grow + 7 + kHead;
            for (int u = 0; u < kBlocks; ++u) store16(gblk + 16 * u, load16(gblk + 16 * u) + gb[u]);
          } else if (kRGB8 && CG == kRGB) {
            for (int64_t c = 0; c < kRGB; ++c) grow[7 + c] += gf[c];
            store8(grow + 7 + kRGB, load8(grow + 7 + kRGB) + g8);
          } else {
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) grow[7 + c] += gf[c];
          }
          grow[0] += g0; grow[1] += g1; grow[2] += g2; grow[3] += g3; grow[4] += g4; grow[5] += g5; grow[6] += g6;
        }
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
      const float* row = isect_grad.get() + (size_t)i * S;
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
