// See buffer.h.
#include "image/buffer.h"

#include <algorithm>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace qvl::image::detail {

void prefault(void* p, size_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  const uintptr_t hb = (begin + kHuge - 1) & ~(kHuge - 1), he = end & ~(kHuge - 1);
  if (he > hb) madvise(reinterpret_cast<void*>(hb), he - hb, MADV_HUGEPAGE);
#endif
  // One byte per 4 KiB page faults it in (a whole huge page where THP applies); the zero
  // written is what the zero-fill writes again.
  constexpr int64_t kPage = 4096;
  const int64_t first = static_cast<int64_t>(begin / kPage), last = static_cast<int64_t>((end - 1) / kPage);
#pragma omp parallel for schedule(static)
  for (int64_t page = first; page <= last; ++page) {
    const uintptr_t a = std::max(begin, static_cast<uintptr_t>(page) * kPage);
    *reinterpret_cast<volatile uint8_t*>(a) = 0;
  }
}

}  // namespace qvl::image::detail
