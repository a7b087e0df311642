// Sixteen-float vectors (GCC/Clang vector extensions) for the CPU kernels' channel loops when
// the channel count is a compile-time multiple of 16: values stay in registers (one AVX-512
// register, or two AVX ones) and horizontal sums are shuffle trees, where the auto-vectorised
// loops spilled their accumulators and summed in order.
#pragma once

#include <cstdint>
#include <cstring>

namespace rh3dgs {

typedef float vf16 __attribute__((vector_size(64)));

inline vf16 load16(const float* p) {
  vf16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store16(float* p, vf16 v) { std::memcpy(p, &v, sizeof(v)); }

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
