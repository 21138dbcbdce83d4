// load_weights: the host weight tree (model/bind.h, views into the mmap'd checkpoint) ->
// the same tree on a backend. Norm weights and biases become F32 (they are small and every
// backend wants them in fp32); embed_tokens and pos_embed keep their dtype; Linears go through
// Backend::load_linear with their parts and dtype unchanged (FP8 stays FP8 with its scales).
// A tied lm_head is not loaded twice: it is a LinearWeight over the loaded embedding table.
// Any backend error (out of memory) is returned with the tensor it was loading.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "model/weights.h"

namespace qvl {

// `resident` (optional) says which decoder layers to load; the others stay empty in the result
// for the caller to fill (layer offload, memory/offload.h). Null: every layer.
Result<ModelWeights> load_weights(Backend& backend, const ModelWeights& host,
                                  const std::function<bool(int layer)>& resident = nullptr);

// Decoder layer `layer` of the host tree on `backend`, as load_weights loads it; host-side
// conversions it makes are kept alive by `keep_alive`.
Result<DecoderLayerWeights> load_decoder_layer(Backend& backend, const ModelWeights& host, int layer,
                                               std::vector<std::shared_ptr<void>>* keep_alive);

}  // namespace qvl
