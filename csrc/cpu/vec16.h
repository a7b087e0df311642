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

}  // namespace rh3dgs
