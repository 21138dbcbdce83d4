// A host memcpy split over OpenMP threads. A single thread copies at ~4-7 GB/s on the GPU
// machine's VM (bench/RESULTS.md runs 20 and 22), well under what its memory system takes, and the
// copies into pinned staging buffers (weights at load, the vision encoder's pixels) sit on the
// critical path before their DMA.
#pragma once

#include <cstddef>

namespace qvl {

// Below this many bytes the copy stays on the calling thread (waking the pool costs more).
inline constexpr size_t kParallelCopyMinBytes = size_t{256} << 10;

// memcpy(dst, src, bytes) over at most max_threads threads (and OpenMP's limit).
void parallel_copy(void* dst, const void* src, size_t bytes, int max_threads = 8);

}  // namespace qvl
