// See parallel_copy.h.
#include "core/parallel_copy.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

namespace qvl {

void parallel_copy(void* dst, const void* src, size_t bytes, int max_threads) {
  const int threads = bytes < kParallelCopyMinBytes ? 1 : std::max(1, std::min(max_threads, omp_get_max_threads()));
  if (threads == 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  auto* to = static_cast<char*>(dst);
  const auto* from = static_cast<const char*>(src);
  const size_t piece = (bytes + threads - 1) / threads;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const size_t b = std::min(bytes, static_cast<size_t>(t) * piece), e = std::min(bytes, b + piece);
    if (e > b) std::memcpy(to + b, from + b, e - b);
  }
}

}  // namespace qvl
