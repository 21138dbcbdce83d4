// Internal: sizing the large pixel buffers of the pipeline (decoded RGB, resized RGB,
// pixel_values - up to hundreds of MB for a 12 MP photo). std::vector zero-fills on resize,
// and for a fresh allocation most of that cost is the kernel's page faults, taken one 4 KiB
// page at a time on the calling thread: on a 288 MB pixel_values it took longer than
// computing the values. resize_large() first asks for transparent huge pages on the
// still-untouched allocation and faults its pages in from all threads, so that the zero-fill
// that follows runs over mapped memory. Both are only about speed: without THP (or off
// Linux) it is a plain resize().
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace qvl::image::detail {

// Advises huge pages for [p, p + bytes) and touches every page of it, in parallel.
void prefault(void* p, size_t bytes);

template <typename T>
void resize_large(std::vector<T>& v, size_t n) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (v.empty() && n * sizeof(T) >= (8u << 20)) {
    v.reserve(n);  // allocate, untouched; std::allocator storage holds implicit-lifetime T
    prefault(v.data(), n * sizeof(T));
  }
  v.resize(n);
}

}  // namespace qvl::image::detail
