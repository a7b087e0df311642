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

// 8 floats (one AVX register): the transposes' rows and the backward's
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

}  // namespace rh3dgs
