// The ModelRunner of the real model: Qwen3VLModel (model/model.h) on a backend. It owns the
// device memory one engine step needs, allocated once when it is made:
//   - the activation arena: the largest image's features (kept while that image's prefill runs)
//     plus the larger of the vision scratch and one decoder step;
//   - the step inputs (token ids, M-RoPE positions, slots, the TextBatch tables, logits rows),
//     at fixed addresses, and the logits rows of one step;
//   - in host memory (Backend::allocate_host: pinned on CUDA), the staging buffer the vision
//     encoder uploads the largest image's pixels and tables through;
// sized by memory/activations.h runner_buffers(), exactly as the planner counts them.
// Image features are the bottom of the arena: encode_image requires an empty arena (the engine
// keeps one image alive at a time) and the features give it back when destroyed.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/status.h"
#include "engine/model_runner.h"
#include "memory/activations.h"
#include "model/model.h"

namespace qvl {

struct Qwen3VLRunnerOptions {
  RunnerLimits limits;
  DType kv_dtype = DType::kBF16;  // the KV cache's element type (the pool must use the same)
  // Run decode-only steps through Backend::run_graph (CUDA graphs). Their host-side shape is
  // bucketed so that one recording serves many steps: the page table at its full width
  // (limits.max_pages_per_seq), max_context rounded up to a power of two (at least 256); the
  // key names every other value (sequences, KV pages, the arena's mark).
  bool decode_graphs = false;
};

// `model` must have been made on `backend`; both are kept alive by the runner.
Result<std::unique_ptr<ModelRunner>> make_qwen3vl_runner(std::shared_ptr<Backend> backend,
                                                         std::shared_ptr<const Qwen3VLModel> model,
                                                         const Qwen3VLRunnerOptions& options);

// The buffers a runner with `limits` allocates (memory/activations.h runner_buffers: the
// planner counts exactly these).
RunnerBuffers runner_buffer_sizes(const ModelConfig& config, const RunnerLimits& limits, DType activation_dtype);

}  // namespace qvl
