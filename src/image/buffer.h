// Internal: sizing the large pixel buffers of the pipeline (decoded RGB, resized RGB,
// pixel_values - up to hundreds of MB for a 12 MP photo). std::vector zero-fills on resize,
// and for a fresh allocation most of that cost is the kernel's 4 KiB page faults, not the
// zeroing: on a 288 MB pixel_values it took longer than computing the values. Advising
// transparent huge pages on the still-untouched allocation first cuts it several-fold. Only
// a hint: where THP is off (or not Linux) the behaviour is plain resize().
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace qvl::image::detail {

template <typename T>
void resize_large(std::vector<T>& v, size_t n) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  if (v.empty() && n * sizeof(T) >= 4 * kHuge) {
    v.reserve(n);
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(v.data()) + kHuge - 1) & ~(kHuge - 1);
    const uintptr_t end = reinterpret_cast<uintptr_t>(v.data() + n) & ~(kHuge - 1);
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
#endif
  v.resize(n);
}

}  // namespace qvl::image::detail
