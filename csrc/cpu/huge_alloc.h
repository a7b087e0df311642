// Large output buffers of the CPU kernels on transparent huge pages.
//
// A fresh 70 MB render ([720, 1280, 19] floats) costs more to page in than to composite: every
// 4 KB page faults once (54 ms of CPU for that tensor here, 10 ms with 2 MB pages), and glibc
// returns such blocks to the kernel on free, so every frame pays it again. PyTorch's own remedy
// (THP_MEM_ALLOC_ENABLE=1) is read once when torch starts; the kernels therefore allocate their
// big outputs and scratch buffers the same way themselves: 2 MB aligned, madvise(MADV_HUGEPAGE), and
// keep freed blocks for the next call (HugePool).
#pragma once

#include <ATen/ATen.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace rh3dgs {

constexpr size_t kHugePage = size_t(2) << 20;

// Freed huge blocks kept for the next allocation of the same size (a render, a backward's scratch):
// glibc hands a block this large back to the kernel on free, and the kernel clears every page of a
// fresh one again (3 % of a 512x512 RGB + 16 latents frame). At most kPoolBytes are kept.
class HugePool {
 public:
  static constexpr size_t kPoolBytes = size_t(256) << 20;
  static HugePool& get() {
    static HugePool* pool = new HugePool();  // never destroyed: tensors may outlive static destructors
    return *pool;
  }
  void* take(size_t rounded) {
    std::lock_guard<std::mutex> lock(m_);
    for (size_t i = 0; i < blocks_.size(); ++i) {
      if (blocks_[i].first == rounded) {
        void* p = blocks_[i].second;
        blocks_.erase(blocks_.begin() + i);
        held_ -= rounded;
        return p;
      }
    }
    return nullptr;
  }
  void give(void* p, size_t rounded) {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (held_ + rounded <= kPoolBytes) {
        blocks_.emplace_back(rounded, p);
        held_ += rounded;
        return;
      }
    }
    std::free(p);
  }

 private:
  std::mutex m_;
  std::vector<std::pair<size_t, void*>> blocks_;
  size_t held_ = 0;
};

inline size_t huge_rounded(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }

// Uninitialised memory for `bytes` bytes: huge-page backed (and from the pool) when at least one huge
// page; release it with huge_free(p, bytes).
inline void* huge_malloc(size_t bytes) {
  void* p = nullptr;
  if (bytes >= kHugePage) {
    const size_t rounded = huge_rounded(bytes);
    if ((p = HugePool::get().take(rounded)) != nullptr) return p;
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

inline void huge_free(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (bytes >= kHugePage) HugePool::get().give(p, huge_rounded(bytes));
  else std::free(p);
}

// at::empty(sizes, options) on huge pages (CPU, contiguous); freed with the tensor.
inline at::Tensor empty_huge(at::IntArrayRef sizes, const at::TensorOptions& options) {
  int64_t n = 1;
  for (const auto s : sizes) n *= s;
  const size_t bytes = (size_t)n * options.dtype().itemsize();
  void* p = huge_malloc(bytes);
  return at::from_blob(p, sizes, [bytes](void* q) { huge_free(q, bytes); }, options.device(at::kCPU));
}

struct HugeDeleter {
  size_t bytes;
  void operator()(void* p) const { huge_free(p, bytes); }
};

// A scratch array of n (uninitialised) T on huge pages.
template <class T>
inline std::unique_ptr<T[], HugeDeleter> huge_array(size_t n) {
  return std::unique_ptr<T[], HugeDeleter>(static_cast<T*>(huge_malloc(n * sizeof(T))), HugeDeleter{n * sizeof(T)});
}

}  // namespace rh3dgs
