// Horizontal sums and dot products for the CPU kernels.
//
// Without -ffast-math a `#pragma omp simd reduction(+ : s)` may still be summed in order: n
// dependent adds (4 cycles each), which made the 16-channel and 64-dimension dot products of
// the backward and aggregate kernels latency bound. tree_sum() halves instead: log2(n) vector
// adds. The order is fixed by n alone, so results stay deterministic.
#pragma once

#include <cstdint>

#include "vec16.h"

namespace rh3dgs {

// Sum of x[0 .. n) by pairwise halving, in place (x is overwritten). CT > 0: n = CT known at
// compile time (the loop unrolls into vector adds); CT = 0: n = n_rt.
template <int CT>
inline float tree_sum(float* __restrict x, int64_t n_rt) {
  int64_t m = CT > 0 ? CT : n_rt;
  if (m <= 0) return 0.0f;
  while (m > 1) {
    const int64_t h = m / 2, rest = m - h;
#pragma omp simd
    for (int64_t i = 0; i < h; ++i) x[i] += x[rest + i];
    m = rest;
  }
  return x[0];
}

// <u, v> of n floats in a fixed order (deterministic): 16-float vectors and a shuffle-tree sum when
// n = CT is a compile-time multiple of 16, else the products in tmp (n floats of scratch, overwritten)
// and tree_sum.
template <int CT>
inline float dot(const float* __restrict u, const float* __restrict v, float* __restrict tmp, int64_t n_rt) {
  constexpr int kV = (CT > 0 && CT % 16 == 0) ? CT / 16 : 0;
  if constexpr (kV > 0) {
    vf16 acc{};
    for (int i = 0; i < kV; ++i) acc += load16(u + 16 * i) * load16(v + 16 * i);
    return hsum16(acc);
  } else {
    const int64_t n = CT > 0 ? CT : n_rt;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) tmp[i] = u[i] * v[i];
    return tree_sum<CT>(tmp, n);
  }
}

}  // namespace rh3dgs
