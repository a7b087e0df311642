// Branch-free float approximations for the CPU kernels (vectorisable, no libm calls).
// Errors are far below the 1e-4 agreement the ops are tested to against their torch references.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "vec16.h"

namespace rh3dgs {

// exp(x) for x in [-88, 0]: Cody-Waite range reduction and a degree-6 polynomial (Cephes expf).
inline float exp_neg(float x) {
  x = std::max(x, -87.0f);
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (floorf does not vectorise without -ffast-math)
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = ((int32_t)n + 127) << 23;
  return y * std::bit_cast<float>(bits);
}

// exp_neg() on a native vector (kNativeLanes lanes), the same operations in the same order (so
// the same bits per lane). Written with vector types and selects because GCC (12, AVX2) does not
// vectorise the scalar function inside an `omp simd` loop: std::min / std::max and the selects
// become control flow ("not vectorized: control flow in loop") and the loop ran scalar.
inline vfn exp_neg_v(vfn x) {
  x = x < -87.0f ? splatn(-87.0f) : x;  // std::max(x, -87)
  const vfn n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const vfn r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  vfn p = splatn(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const vfn y = p * r * r + r + 1.0f;
  const vin bits = (__builtin_convertvector(n, vin) + 127) << 23;
  vfn scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

// Lane-wise helpers with the scalar and the native-vector forms side by side, so that one template
// (atan2_pos, the lift's IRLS weights) gives the same bits per lane as the scalar code.
inline float sqrt_l(float x) { return std::sqrt(x); }
inline vfn sqrt_l(vfn x) { return sqrtn(x); }
inline float fabs_l(float x) { return std::fabs(x); }
inline vfn fabs_l(vfn x) {  // clears the sign bit, as std::fabs
  vin b;
  std::memcpy(&b, &x, sizeof(b));
  b &= 0x7fffffff;
  std::memcpy(&x, &b, sizeof(x));
  return x;
}

// atan2(y, x) for y >= 0, in [0, pi]: reduction to [0, tan(pi/8)] and the Cephes atanf
// polynomial (max abs error 3e-7 over the half circle). F = float or vfn (the same operations
// in the same order: the same bits per lane); min / max written out as std::min / std::max define them.
template <class F>
inline F atan2_pos(F y, F x) {
  const F ax = fabs_l(x);
  const F mn = ax < y ? ax : y, mx = y < ax ? ax : y;  // std::min(y, ax), std::max(y, ax)
  const F t = mx > 0.0f ? mn / mx : F{};  // [0, 1]
  const auto big = t > 0.41421356237f;          // tan(pi/8)
  const F tr = big ? (t - 1.0f) / (t + 1.0f) : t;
  const F z = tr * tr;
  const F p = ((8.05374449538e-2f * z - 1.38776856032e-1f) * z + 1.99777106478e-1f) * z - 3.33329491539e-1f;
  F r = p * z * tr + tr + (big ? F{} + 0.78539816339f : F{});
  r = y > ax ? 1.57079632679f - r : r;
  return x < 0.0f ? 3.14159265359f - r : r;
}

}  // namespace rh3dgs
