// Compile-time channel counts for the CPU kernels: a kernel templated on CT (> 0) has constant
// trip counts in its per-channel loops, which the compiler turns into whole vector operations
// without alias checks or scalar tails; CT = 0 is the generic kernel for any count.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace rh3dgs {

// Calls fn(std::integral_constant<int, CT>{}) with CT = C for the common counts, else CT = 0.
// 11, 19 and 35: RGB composited together with 8, 16 or 32 latent channels (11: ns-train's rh3dgs-lite, whose
// latents have 8 dimensions; 19 / 35: the viewer's frames and rh3dgs).
template <typename Fn>
decltype(auto) dispatch_channels(int64_t C, Fn&& fn) {
  switch (C) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    case 8: return fn(std::integral_constant<int, 8>{});
    case 11: return fn(std::integral_constant<int, 11>{});
    case 16: return fn(std::integral_constant<int, 16>{});
    case 19: return fn(std::integral_constant<int, 19>{});
    case 32: return fn(std::integral_constant<int, 32>{});
    case 35: return fn(std::integral_constant<int, 35>{});
    case 64: return fn(std::integral_constant<int, 64>{});
    default: return fn(std::integral_constant<int, 0>{});
  }
}

// The lift's feature dimensions (aggregate_sphere): the counts above and 128, the dimension of the
// principal subspace a CLIP-sized teacher (D = 512) is lifted in (LiftConfig.subspace).
template <typename Fn>
decltype(auto) dispatch_feature_dims(int64_t D, Fn&& fn) {
  if (D == 128) return fn(std::integral_constant<int, 128>{});
  return dispatch_channels(D, std::forward<Fn>(fn));
}

}  // namespace rh3dgs
