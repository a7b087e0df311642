// Large output buffers of the CPU kernels on transparent huge pages.
//
// A fresh 70 MB render ([720, 1280, 19] floats) costs more to page in than to composite: every
// 4 KB page faults once (54 ms of CPU for that tensor here, 10 ms with 2 MB pages), and glibc
// returns such blocks to the kernel on free, so every frame pays it again. PyTorch's own remedy
// (THP_MEM_ALLOC_ENABLE=1) is read once when torch starts; the kernels therefore allocate their
// big outputs and scratch buffers the same way themselves: 2 MB aligned, madvise(MADV_HUGEPAGE).
#pragma once

#include <ATen/ATen.h>

#include <cstdlib>
#include <memory>
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace rh3dgs {

constexpr size_t kHugePage = size_t(2) << 20;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Uninitialised memory for `bytes` bytes: huge-page backed when at least one huge page.
inline void* huge_malloc(size_t bytes) {
  void* p = nullptr;
  if (bytes >= kHugePage) {
    const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    if (posix_memalign(&p, kHugePage, rounded) != 0) p = nullptr;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p) madvise(p, rounded, MADV_HUGEPAGE);  // advisory: ignored where THP is off
#endif
  } else if (posix_memalign(&p, 64, bytes > 0 ? bytes : 64) != 0) {
    p = nullptr;
  }
  TORCH_CHECK(p != nullptr, "rh3dgs: out of memory allocating ", bytes, " bytes");
  return p;
}

// at::empty(sizes, options) on huge pages (CPU, contiguous); freed with the tensor.
inline at::Tensor empty_huge(at::IntArrayRef sizes, const at::TensorOptions& options) {
  int64_t n = 1;
  for (const auto s : sizes) n *= s;
  const size_t bytes = (size_t)n * options.dtype().itemsize();
  void* p = huge_malloc(bytes);
  return at::from_blob(p, sizes, [](void* q) { std::free(q); }, options.device(at::kCPU));
}

// A scratch array of n floats on huge pages.
inline std::unique_ptr<float[], FreeDeleter> huge_floats(size_t n) {
  return std::unique_ptr<float[], FreeDeleter>(static_cast<float*>(huge_malloc(n * sizeof(float))));
}

}  // namespace rh3dgs
