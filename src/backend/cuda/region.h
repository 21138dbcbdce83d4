// Growable device regions on CUDA's virtual memory API: reserve an address range once, then
// back it with physical memory chunk by chunk (cuMemCreate + cuMemMap), so the KV page pool
// grows without moving and nothing that points into it (page tables, captured graphs) goes
// stale. The driver API is reached through cudaGetDriverEntryPointByVersion, so qvl does not
// link libcuda and still starts on machines without a driver.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace qvl::cuda {

// Bytes committed through the backend (allocations and regions), shared with every buffer
// and region so their destructors can update it after the backend is gone.
struct AllocationStats {
  std::atomic<size_t> allocated{0};
  std::atomic<size_t> peak{0};
  void add(size_t bytes) {
    size_t now = allocated.fetch_add(bytes) + bytes;
    size_t prev = peak.load();
    while (now > prev && !peak.compare_exchange_weak(prev, now)) {
    }
  }
  void sub(size_t bytes) { allocated.fetch_sub(bytes); }
};

// Reserves `max_bytes` (rounded up to the allocation granularity) on `device`.
Result<std::unique_ptr<DeviceRegion>> reserve_vmm_region(int device, size_t max_bytes, const std::string& tag,
                                                         std::shared_ptr<AllocationStats> stats);

}  // namespace qvl::cuda
