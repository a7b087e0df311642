// Lane vectors for the pixel-parallel kernels: W pixels of a tile row in the lanes of one register
// (W = 16: AVX-512; W = 8: AVX-512VL, AVX2, or plain vector code on other CPUs), with the masks that
// keep early ray termination per pixel.
//
// Lanes<W> gives V (W floats), VI (W int32) and M (a mask of W lanes) and the operations the compositing
// needs. Masked operations leave the other lanes exactly as they were (no "+ 0": the bits of a lane that
// a Gaussian does not touch never change, -0.0 and NaN included), so a lane computes what a scalar loop
// over that pixel computes. The arithmetic is plain vector arithmetic (GCC vector extensions) and
// explicit fused multiply-adds where the scalar kernels had them (GCC contracts a * b + c even with
// -std=c++20), so that per lane the bits are those of the scalar code.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <utility>
#include <cstring>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "vec16.h"

namespace rh3dgs {

typedef int32_t vi8 __attribute__((vector_size(32)));
typedef int32_t vi16 __attribute__((vector_size(64)));

template <int W>
struct Lanes;

// AVX-512 lanes of WIDTH floats in a BITS-bit register (16 / 512, and 8 / 256 with AVX512VL): masks are
// k-registers, selects and masked multiply-adds single instructions. One definition for both widths.
#define RH3DGS_MASKED_LANES(WIDTH, BITS)                                                                        \
  template <>                                                                                                  \
  struct Lanes<WIDTH> {                                                                                        \
    static constexpr int W = WIDTH;                                                                            \
    using V = vf##WIDTH;                                                                                       \
    using VI = vi##WIDTH;                                                                                      \
    using M = __mmask##WIDTH;                                                                                  \
    using R = __m##BITS;                                                                                       \
    using RI = __m##BITS##i;                                                                                   \
    static V load(const float* p) { return (V)_mm##BITS##_loadu_ps(p); }                                       \
    static void store(float* p, V v) { _mm##BITS##_storeu_ps(p, (R)v); }                                      \
    static void store_first(float* p, V v, int n) { _mm##BITS##_mask_storeu_ps(p, first(n), (R)v); }          \
    static void store_first(int32_t* p, VI v, int n) { _mm##BITS##_mask_storeu_epi32(p, first(n), (RI)v); }   \
    static V load_first(const float* p, int n) { return (V)_mm##BITS##_maskz_loadu_ps(first(n), p); }         \
    static VI load_first(const int32_t* p, int n) { return (VI)_mm##BITS##_maskz_loadu_epi32(first(n), p); }  \
    static M first(int n) { return (M)((1u << n) - 1u); } /* lanes [0, n), n <= WIDTH; 0 beyond n on loads */ \
    static M lei(int32_t k, VI v) {                                                                            \
      return _mm##BITS##_cmp_epi32_mask(_mm##BITS##_set1_epi32(k), (RI)v, _MM_CMPINT_LE);                      \
    }                                                                                                          \
    static M gt(V a, V b) { return _mm##BITS##_cmp_ps_mask((R)a, (R)b, _CMP_GT_OQ); }                          \
    static M le(V a, V b) { return _mm##BITS##_cmp_ps_mask((R)a, (R)b, _CMP_LE_OQ); }                          \
    static V blend(M m, V a, V b) { return (V)_mm##BITS##_mask_blend_ps(m, (R)b, (R)a); } /* m ? a : b */      \
    static V min(V a, V b) { return (V)_mm##BITS##_min_ps((R)a, (R)b); } /* a < b ? a : b (std::min(b, a)) */ \
    static VI blend(M m, VI a, VI b) { return (VI)_mm##BITS##_mask_blend_epi32(m, (RI)b, (RI)a); }             \
    static V fma(M m, V a, V b, V c) { return (V)_mm##BITS##_mask3_fmadd_ps((R)a, (R)b, (R)c, m); }            \
    /* m ? a *p + c : c with *p broadcast from memory inside the multiply-add (GCC emits a separate broadcast   \
       for the intrinsic form: one more instruction per channel of every (Gaussian, row) segment) */           \
    static V fma_bcast(M m, V a, const float* p, V c) {                                                        \
      R r = (R)c;                                                                                              \
      asm("vfmadd231ps %[p]%{1to" #WIDTH "%}, %[a], %[r]%{%[m]%}"                                              \
          : [r] "+v"(r)                                                                                        \
          : [a] "v"((R)a), [p] "m"(*p), [m] "Yk"(m));                                                          \
      return (V)r;                                                                                             \
    }                                                                                                          \
    static V add(M m, V a, V b) { return (V)_mm##BITS##_mask_add_ps((R)a, m, (R)a, (R)b); } /* m ? a + b : a */ \
    static bool any(M m) { return m != 0; }                                                                    \
    static uint32_t bits(M m) { return m; }                                                                    \
    static M from_bits(uint32_t b) { return (M)b; }                                                            \
    static M andnot(M a, M b) { return (M)(~a & b); } /* b and not a */                                        \
  };

#if defined(__AVX512F__)
RH3DGS_MASKED_LANES(16, 512)
#endif

#if defined(__AVX512F__) && defined(__AVX512VL__)
RH3DGS_MASKED_LANES(8, 256)
#else
// AVX2 (or any CPU): a mask is a vector of 0 / -1 per lane; selects are blends.
template <>
struct Lanes<8> {
  static constexpr int W = 8;
  using V = vf8;
  using VI = vi8;
  using M = vi8;
  static V load(const float* p) { return load8(p); }
  static void store(float* p, V v) { store8(p, v); }
  static void store_first(float* p, V v, int n) {
    float t[8];
    store8(t, v);
    std::memcpy(p, t, sizeof(float) * n);
  }
  static void store_first(int32_t* p, VI v, int n) {
    int32_t t[8];
    std::memcpy(t, &v, sizeof(t));
    std::memcpy(p, t, sizeof(int32_t) * n);
  }
  static V load_first(const float* p, int n) {
    float t[8] = {};
    std::memcpy(t, p, sizeof(float) * n);
    return load8(t);
  }
  static VI load_first(const int32_t* p, int n) {
    int32_t t[8] = {};
    std::memcpy(t, p, sizeof(int32_t) * n);
    VI v;
    std::memcpy(&v, t, sizeof(v));
    return v;
  }
  static M first(int n) {
    const vi8 iota = {0, 1, 2, 3, 4, 5, 6, 7};
    return iota < n;
  }
  static M lei(int32_t k, VI v) { return (VI{} + k) <= v; }
  static M gt(V a, V b) { return a > b; }
  static M le(V a, V b) { return a <= b; }
  static V blend(M m, V a, V b) { return m ? a : b; }
  static V min(V a, V b) { return a < b ? a : b; }
  static VI blend(M m, VI a, VI b) { return m ? a : b; }
#if defined(__FMA__)
  static V fma(M m, V a, V b, V c) { return m ? (V)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c) : c; }
#else
  static V fma(M m, V a, V b, V c) { return m ? a * b + c : c; }
#endif
  static V add(M m, V a, V b) { return m ? a + b : a; }
#if defined(__AVX__)
  static V fma_bcast(M m, V a, const float* p, V c) { return fma(m, a, (V)_mm256_set1_ps(*p), c); }
#else
  static V fma_bcast(M m, V a, const float* p, V c) { return fma(m, a, *p - V{}, c); }
#endif
  static uint32_t bits(M m) {
#if defined(__AVX2__)
    return (uint32_t)_mm256_movemask_ps((__m256)m);
#else
    uint32_t r = 0;
    for (int l = 0; l < 8; ++l) r |= (uint32_t)(m[l] != 0) << l;
    return r;
#endif
  }
  static bool any(M m) { return bits(m) != 0; }
  static M from_bits(uint32_t b) {
    const vi8 iota = {0, 1, 2, 3, 4, 5, 6, 7};
    return ((vi8{} + (int32_t)b) >> iota & 1) != 0;
  }
  static M andnot(M a, M b) { return ~a & b; }
};
#endif
#undef RH3DGS_MASKED_LANES

// x in every lane (not V{} + x: 0 + x is a scalar add before the broadcast, as -0.0 + 0 = +0).
template <class V>
inline V splat(float x) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) return (V)_mm512_set1_ps(x);
#endif
#if defined(__AVX__)
  if constexpr (sizeof(V) == 32) return (V)_mm256_set1_ps(x);
#endif
  return x - V{};  // x - (+0) is x for every x (-0.0 and NaN included)
}

// The lane width of the pixel-parallel kernels: one native register.
#if defined(__AVX512F__)
constexpr int kUnitLanes = 16;
#else
constexpr int kUnitLanes = 8;
#endif
using Unit = Lanes<kUnitLanes>;

// fn(std::integral_constant<int, I>{}) for I = 0 .. N-1: loops over compile-time channel counts whose
// index must be a constant (an array of vector accumulators indexed by a loop variable lives in memory).
template <int N, class Fn>
inline void static_for(Fn&& fn) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (fn(std::integral_constant<int, I>{}), ...); }(
      std::make_integer_sequence<int, N>{});
}

// exp(x) for x in [-kSigmaSkip, 0] (the alpha's exp(-sigma)): Cody-Waite reduction to r in [-ln2 / 2, ln2 / 2]
// and a degree-5 polynomial in Horner form (a near-minimax fit of exp on that interval; 5 multiply-adds where
// fastmath.h's Cephes form, exp_neg, takes 8 operations), max relative error 2.3e-7 over the range (CUDA: __expf; the
// torch reference: torch.exp).
template <class V>
inline V exp_neg_alpha(V x) {
  typedef int32_t VI __attribute__((vector_size(sizeof(V))));
  const V n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const V r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  V p = splat<V>(8.296216838e-03f);
  p = p * r + 4.192536697e-02f;
  p = p * r + 1.666764915e-01f;
  p = p * r + 4.999880493e-01f;
  p = p * r + 9.999996424e-01f;
  p = p * r + 1.000000119e+00f;
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) return (V)_mm512_scalef_ps((__m512)p, (__m512)n);
#endif
#if defined(__AVX512F__) && defined(__AVX512VL__)
  if constexpr (sizeof(V) == 32) return (V)_mm256_scalef_ps((__m256)p, (__m256)n);
#endif
  const VI bits = (__builtin_convertvector(n, VI) + 127) << 23;
  V scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// 8 x 8 transpose: r[i][j] -> r[j][i] (24 shuffles).
__attribute__((always_inline)) inline void transpose8(vf8 r[8]) {
  vf8 t[8], s[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4) {
    for (int h = 0; h < 2; ++h) {
      s[i + 2 * h] = __builtin_shufflevector(t[i + h], t[i + 2 + h], 0, 1, 8, 9, 4, 5, 12, 13);
      s[i + 2 * h + 1] = __builtin_shufflevector(t[i + h], t[i + 2 + h], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  }
  // s[q] (q < 4) holds rows 0-3 of columns q (low half) and q + 4 (high half); s[4 + q] rows 4-7
  for (int q = 0; q < 4; ++q) {
    r[q] = __builtin_shufflevector(s[q], s[4 + q], 0, 1, 2, 3, 8, 9, 10, 11);
    r[q + 4] = __builtin_shufflevector(s[q], s[4 + q], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

// The lane sums of eight vectors q[0 .. 8) in a fixed order (a transposed tree: 21 shuffles and adds for
// 8 lanes, 23 for 16, where eight separate horizontal sums take 48 / 64): lane i of the result holds the
// sum of q[kReducePerm[i]] (the bit reversal of i, its own inverse).
constexpr int kReducePerm[8] = {0, 4, 2, 6, 1, 5, 3, 7};
__attribute__((always_inline)) inline vf8 reduce8(const vf8 q[8]) {
  vf8 r[4], s[2];
  for (int i = 0; i < 4; ++i)
    r[i] = __builtin_shufflevector(q[2 * i], q[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(q[2 * i], q[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  for (int j = 0; j < 2; ++j)
    s[j] = __builtin_shufflevector(r[2 * j], r[2 * j + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
           __builtin_shufflevector(r[2 * j], r[2 * j + 1], 2, 3, 10, 11, 6, 7, 14, 15);
  return __builtin_shufflevector(s[0], s[1], 0, 8, 2, 10, 4, 12, 6, 14) +
         __builtin_shufflevector(s[0], s[1], 1, 9, 3, 11, 5, 13, 7, 15);
}
__attribute__((always_inline)) inline vf8 reduce8(const vf16 q[8]) {
  vf16 r[4], s[2];
  for (int i = 0; i < 4; ++i)
    r[i] = __builtin_shufflevector(q[2 * i], q[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(q[2 * i], q[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int j = 0; j < 2; ++j)
    s[j] = __builtin_shufflevector(r[2 * j], r[2 * j + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
           __builtin_shufflevector(r[2 * j], r[2 * j + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  const vf16 t = __builtin_shufflevector(s[0], s[1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
                 __builtin_shufflevector(s[0], s[1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  return __builtin_shufflevector(t, t, 0, 2, 4, 6, 8, 10, 12, 14) + __builtin_shufflevector(t, t, 1, 3, 5, 7, 9, 11, 13, 15);
}


// 16 x 16 transpose: r[i][j] -> r[j][i] (64 two-source shuffles: unpack within 128-bit lanes, then 128-bit
// blocks across registers).
__attribute__((always_inline)) inline void transpose16(vf16 r[16]) {
  vf16 t[16], s[16], v[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
    t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
  }
  for (int b = 0; b < 16; b += 4) {
    for (int h = 0; h < 2; ++h) {
      s[b + 2 * h] = __builtin_shufflevector(t[b + h], t[b + 2 + h], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
      s[b + 2 * h + 1] =
          __builtin_shufflevector(t[b + h], t[b + 2 + h], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    }
  }
  // s[b + q]: rows b .. b + 3 of the columns q, q + 4, q + 8, q + 12 in its four 128-bit blocks
  for (int b = 0; b < 16; b += 8) {
    for (int q = 0; q < 4; ++q) {
      v[b + q] = __builtin_shufflevector(s[b + q], s[b + 4 + q], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
      v[b + 4 + q] =
          __builtin_shufflevector(s[b + q], s[b + 4 + q], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    }
  }
  // v[j] (j < 8): rows 0 .. 7 of the columns j (low half) and j + 8 (high half); v[8 + j]: rows 8 .. 15
  for (int j = 0; j < 8; ++j) {
    r[j] = __builtin_shufflevector(v[j], v[8 + j], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    r[j + 8] = __builtin_shufflevector(v[j], v[8 + j], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
}

// Three channels of 16 pixels (c[0], c[1], c[2]: lane l = pixel l) written pixel-major, 48 contiguous floats
// out[3 l + ch] (RGB): two two-source shuffles per output vector.
namespace detail {
template <int J, int Step>  // Step 0: channels 0 and 1 of output vector J; Step 1: channel 2 into it
constexpr std::array<int, 16> rgb_index() {
  std::array<int, 16> a{};
  for (int i = 0; i < 16; ++i) {
    const int q = 16 * J + i, l = q / 3, ch = q % 3;
    a[i] = Step == 0 ? (ch == 0 ? l : ch == 1 ? 16 + l : 0) : (ch == 2 ? 16 + l : i);
  }
  return a;
}
}  // namespace detail
#define RH_IDX16(a) a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]
inline void store_rgb16(const vf16 c[3], float* out) {
  static_for<3>([&](auto j) {
    constexpr auto i0 = detail::rgb_index<decltype(j)::value, 0>();
    constexpr auto i1 = detail::rgb_index<decltype(j)::value, 1>();
    const vf16 rg = __builtin_shufflevector(c[0], c[1], RH_IDX16(i0));
    store16(out + 16 * j, __builtin_shufflevector(rg, c[2], RH_IDX16(i1)));
  });
}
#undef RH_IDX16

// A row unit's channels, channel-major in[c * W + l] (lane l = pixel l), written pixel-major into
// out[l * n + c] for the pixels l < nu (n channels, n = CT when CT > 0): the first n % 8 channels one by one,
// then blocks of 8 channels by 8 x 8 transposes (one vector store per pixel and block).
template <int W, int CT>
inline void store_pixel_major(const float* __restrict in, int64_t n_rt, float* __restrict out, int nu) {
  const int64_t n = CT > 0 ? CT : n_rt, h = n % 8;
  for (int l = 0; l < nu; ++l)
    for (int64_t c = 0; c < h; ++c) out[l * n + c] = in[c * W + l];
  for (int64_t c0 = h; c0 < n; c0 += 8) {
    for (int p0 = 0; p0 < nu; p0 += 8) {
      vf8 r[8];
      for (int i = 0; i < 8; ++i) r[i] = load8(in + (c0 + i) * W + p0);
      transpose8(r);
      for (int j = 0; j < std::min(8, nu - p0); ++j) store8(out + (p0 + j) * n + c0, r[j]);
    }
  }
}

}  // namespace rh3dgs
