// Layer offload (`--offload-layers N`): the weights of the last N decoder layers live in host
// memory that the backend copies from asynchronously (pinned, on CUDA) and stream, layer after
// layer, through kPrefetchSlots device staging buffers of one layer each: while one offloaded
// layer computes out of one buffer, the next is copied into the other on a second stream
// (Backend::prefetch / wait_prefetch), and a buffer is refilled only after the layer that read
// it has finished. Copies and waits are ordinary backend calls, so a decode step recorded as a
// CUDA graph records them too.
//
// Exactness: each offloaded layer is loaded by the backend itself, into a staging buffer through
// a WeightPlacement, and those device bytes are copied back to the host; streaming them in again
// restores exactly what a resident layer would hold, so logits are bit-identical with and
// without offload (same kernels, same weights, same layout).
//
// Memory: the staging buffers are one allocation of min(N, kPrefetchSlots) ×
// WeightBytes::largest_layer bytes, MemoryPlan::offload_staging; the resident layers are what
// the plan keeps in weights_device. The host side holds N layers (MemoryPlan::weights_offloaded
// at most).
//
// Invariants: offloaded layers are [L − N, L) (the first two copies of a step overlap the
// resident layers); offloaded layer k lives in slot k % min(N, kPrefetchSlots); a layer that does
// not fit one slot fails the load with the sizes.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "core/status.h"
#include "model/config.h"
#include "model/weights.h"

namespace qvl {

struct OffloadStats {
  int layers = 0;             // offloaded decoder layers
  int64_t slot_bytes = 0;     // one staging buffer
  int64_t staging_bytes = 0;  // all staging buffers (one device allocation)
  int64_t host_bytes = 0;     // host memory holding the offloaded layers
};

// load_weights (model/load.h) with the last `offload_layers` decoder layers of `config` in host
// memory, streamed in for every step through ModelWeights::layer_stream. 0 layers: exactly
// load_weights. Errors: a backend that cannot stream weights, more layers than the model has,
// out of device or host memory (with the sizes).
Result<ModelWeights> load_weights_offloaded(Backend& backend, const ModelConfig& config, const ModelWeights& host,
                                            int offload_layers, OffloadStats* stats = nullptr);

}  // namespace qvl
