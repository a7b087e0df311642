// Sixteen-float vectors (GCC/Clang vector extensions) for the CPU kernels' channel loops when
// the channel count is a compile-time multiple of 16: values stay in registers (one AVX-512
// register, or two AVX ones) and horizontal sums are shuffle trees, where the auto-vectorised
// loops spilled their accumulators and summed in order.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace rh3dgs {

typedef float vf16 __attribute__((vector_size(64)));

// The machine's native float vector (AVX-512: 16 lanes, else 8), for lane-wise code with
// compares and selects: on a 16-lane type without AVX-512, GCC 12 lowers `a < b ? x : y`
// lane by lane in scalar code (a 64-byte type is fine for plain arithmetic, not for selects).
#if defined(__AVX512F__)
constexpr int kNativeLanes = 16;
#else
constexpr int kNativeLanes = 8;
#endif
typedef float vfn __attribute__((vector_size(4 * kNativeLanes)));
typedef int32_t vin __attribute__((vector_size(4 * kNativeLanes)));

inline vfn loadn(const float* p) {
  vfn v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void storen(float* p, vfn v) { std::memcpy(p, &v, sizeof(v)); }
inline vfn splatn(float x) { return vfn{} + x; }
// Lane-wise ceil / floor (exact, as std::ceil / std::floor), one instruction each.
inline vfn ceiln(vfn x) {
#if defined(__AVX512F__)
  return (vfn)_mm512_roundscale_ps((__m512)x, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
#elif defined(__AVX2__)
  return (vfn)_mm256_ceil_ps((__m256)x);
#else
  for (int l = 0; l < kNativeLanes; ++l) x[l] = std::ceil(x[l]);
  return x;
#endif
}
inline vfn floorn(vfn x) {
#if defined(__AVX512F__)
  return (vfn)_mm512_roundscale_ps((__m512)x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
#elif defined(__AVX2__)
  return (vfn)_mm256_floor_ps((__m256)x);
#else
  for (int l = 0; l < kNativeLanes; ++l) x[l] = std::floor(x[l]);
  return x;
#endif
}
// Lane-wise IEEE square root (correctly rounded: the bits of std::sqrt), one instruction.
inline vfn sqrtn(vfn x) {
#if defined(__AVX512F__)
  return (vfn)_mm512_sqrt_ps((__m512)x);
#elif defined(__AVX2__)
  return (vfn)_mm256_sqrt_ps((__m256)x);
#else
  for (int l = 0; l < kNativeLanes; ++l) x[l] = std::sqrt(x[l]);
  return x;
#endif
}

inline vf16 load16(const float* p) {
  vf16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store16(float* p, vf16 v) { std::memcpy(p, &v, sizeof(v)); }

// 8 floats (one AVX register): RowAccum's block for C % 16 >= 8 (RGB + 8 latents) and the backward's
// 8 latents' feature gradients.
typedef float vf8 __attribute__((vector_size(32)));

inline vf8 load8(const float* p) {
  vf8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store8(float* p, vf8 v) { std::memcpy(p, &v, sizeof(v)); }

inline vf16 splat16(float x) { return vf16{} + x; }

// Sum of the 16 lanes (fixed pairwise order: deterministic).
inline float hsum16(vf16 v) {
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
  v += __builtin_shufflevector(v, v, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
  return v[0];
}

// acc[0 .. n) += w * x[0 .. n): whole 16-float blocks as vector operations, then the tail
// (n = CT when CT > 0, else n_rt). For counts like 3 + 16 the auto-vectorised loop paid
// its runtime trip-count and alias checks on every call.
template <int CT>
inline void axpy(float* __restrict acc, float w, const float* __restrict x, int64_t n_rt) {
  const int64_t n = CT > 0 ? CT : n_rt;
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) store16(acc + c, load16(acc + c) + w * load16(x + c));
  for (; c < n; ++c) acc[c] += w * x[c];
}

// Per-pixel channel accumulators of one tile row (L pixels x C channels) for the forward
// compositing. The first R = C % 8 channels (RGB in RGB + 8 / 16 / 32 latents) are scalars; an
// 8-float block follows when C % 16 >= 8 (e.g. rh3dgs-lite's 8 latents after RGB: C = 11), then the
// 16-float blocks; each block is stored as an aligned vector per pixel. Adding a contribution is R scalar
// and one vector multiply-add per block, acc += w * f, the same per-channel operation as axpy() (the
// scalars and 16-blocks give its bits; the 8-block's sums can differ from it by an ulp, measured 6e-8),
// without the misaligned, line-crossing loads and stores of a packed [L][C] row (8 latents as scalars made the forward 1.20-1.32x the C = 3 one at 512x512). CT > 0 only.
template <int CT>
struct RowAccum {
  static_assert(CT > 0, "compile-time channel count");
  static constexpr int kR = CT % 8, kE = (CT % 16) / 8, kV = CT / 16;  // scalars, 8-blocks (0 / 1), 16-blocks
  std::vector<float> head;  // [L][kR]
  std::vector<vf8> eight;   // [L][kE]
  std::vector<vf16> vec;    // [L][kV]

  explicit RowAccum(int64_t L)
      : head((size_t)L * (kR > 0 ? kR : 1)), eight((size_t)L * (kE > 0 ? kE : 1)), vec((size_t)L * (kV > 0 ? kV : 1)) {}
  void clear() {
    std::fill(head.begin(), head.end(), 0.0f);
    std::fill(eight.begin(), eight.end(), vf8{});
    std::fill(vec.begin(), vec.end(), vf16{});
  }
  // One Gaussian's feature row, loaded once per (Gaussian, row) segment: its contributions then
  // read it from registers (it was re-read, unaligned, for every pixel of the segment).
  struct Row {
    float h[kR > 0 ? kR : 1];
    vf8 e;
    vf16 v[kV > 0 ? kV : 1];
  };
  static inline Row load(const float* __restrict f) {
    Row r;
    for (int c = 0; c < kR; ++c) r.h[c] = f[c];
    if constexpr (kE > 0) r.e = load8(f + kR);
    for (int u = 0; u < kV; ++u) r.v[u] = load16(f + kR + 8 * kE + 16 * u);
    return r;
  }
  inline void add(int64_t l, float w, const Row& f) {
    float* h = head.data() + l * kR;
    for (int c = 0; c < kR; ++c) h[c] += w * f.h[c];
    if constexpr (kE > 0) eight[l] += w * f.e;
    vf16* v = vec.data() + l * kV;
    for (int u = 0; u < kV; ++u) v[u] += w * f.v[u];
  }
  // Pixel l's CT channels into out: acc + T bg (bg: CT floats, or nullptr for none: acc + 0), the
  // blocks as vector stores (the channel-by-channel copy was a lane extraction per channel).
  inline void store(int64_t l, float* __restrict out, const float* __restrict bg, float T) const {
    for (int c = 0; c < kR; ++c) out[c] = head[l * kR + c] + (bg ? T * bg[c] : 0.0f);
    if constexpr (kE > 0) {
      const vf8 b = bg ? T * load8(bg + kR) : vf8{};
      store8(out + kR, eight[l] + b);
    }
    for (int u = 0; u < kV; ++u) {
      const float* bu = bg ? bg + kR + 8 * kE + 16 * u : nullptr;
      const vf16 b = bu ? T * load16(bu) : vf16{};
      store16(out + kR + 8 * kE + 16 * u, vec[l * kV + u] + b);
    }
  }
};

}  // namespace rh3dgs
