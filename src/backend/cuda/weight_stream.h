// Weight streaming for layer offload (memory/offload.h) on CUDA: pinned host memory, and copies
// host -> device on a second stream ordered against the compute stream by events, so a layer's
// weights arrive while the layer before it computes. Backend::prefetch / wait_prefetch map to
// prefetch() / wait() here (backend.h has the contract).
//
// Ordering, per slot: prefetch() records `issued` on the compute stream (everything issued so
// far), the copy stream waits for it, copies, and records `ready`; wait() makes the compute
// stream wait for `ready`. Under stream capture the same calls fork the copy stream into the
// recording and join it back, so a recorded decode step replays the copies with it; every
// prefetch must be waited for before the recording ends (the layer schedule guarantees it).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/region.h"

namespace qvl::cuda {

// `bytes` of pinned host memory (cudaHostAlloc), freed with the last copy of the buffer.
Result<DeviceBuffer> allocate_pinned(size_t bytes, const std::string& tag);

class WeightStream {
 public:
  WeightStream() = default;
  WeightStream(const WeightStream&) = delete;
  WeightStream& operator=(const WeightStream&) = delete;
  ~WeightStream();

  // Creates the copy stream and the events (once; later calls do nothing).
  Status init();
  bool ready() const { return copy_ != nullptr; }

  void prefetch(cudaStream_t compute, int slot, void* dst, const void* host_src, size_t bytes);
  void wait(cudaStream_t compute, int slot);

 private:
  cudaStream_t copy_ = nullptr;
  std::array<cudaEvent_t, kPrefetchSlots> issued_{};
  std::array<cudaEvent_t, kPrefetchSlots> ready_{};
};

}  // namespace qvl::cuda
