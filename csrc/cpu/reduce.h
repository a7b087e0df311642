// Horizontal sums for the CPU kernels.
//
// Without -ffast-math a `#pragma omp simd reduction(+ : s)` may still be summed in order: n
// dependent adds (4 cycles each), which made the 16-channel and 64-dimension dot products of
// the backward and aggregate kernels latency bound. tree_sum() halves instead: log2(n) vector
// adds. The order is fixed by n alone, so results stay deterministic.
#pragma once

#include <cstdint>

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

}  // namespace rh3dgs
