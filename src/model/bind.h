// Weight binding: the one place that knows Qwen3-VL checkpoint tensor names (spec §2). It
// fills the typed host weight tree (model/weights.h) with views into a Checkpoint's maps and
// checks every tensor against the official layout (model/tensor_specs.h):
//   - every expected tensor is present with the expected shape and dtype; ALL problems are
//     collected and returned together, one line per tensor, e.g.
//     "model.language_model.layers.3.mlp.up_proj.weight: missing (expected BF16 [128, 64])";
//   - a Linear is block-FP8 iff its weight is F8_E4M3 and `<module>.weight_scale_inv` exists
//     ([ceil(out/B), ceil(in/B)], B = quantization_config.weight_block_size; F32, BF16 or
//     F16: the official Qwen FP8 checkpoints store BF16 scales, some (Qwen3-4B-Instruct-2507-FP8)
//     F16, and transformers' own quantizer writes F32; backends convert them at load);
//     an F8_E4M3 weight needs a quantization_config and its scale; a BF16 weight is accepted
//     for any Linear (the checkpoint, not the config, decides, as in transformers);
//   - q/k/v and gate/up stay separate LinearParts (the backend may merge them);
//   - the Conv3d patch embedding [D, 3, 2, 16, 16] is viewed as a Linear [D, 1536];
//   - tied: lm_head is the embedding table (a stored lm_head.weight is ignored, as transformers
//     ignores it); untied: lm_head.weight is required;
//   - tensors the layout does not name are not errors: they are listed in BindReport.
// The returned tree keeps the checkpoint's maps alive (ModelWeights::keep_alive).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/weights.h"

namespace qvl {

struct BindReport {
  std::vector<std::string> unexpected;  // checkpoint tensors the layout does not use
  bool lm_head_ignored = false;         // tied, but the checkpoint also stores lm_head.weight
  int fp8_linears = 0;                  // Linear parts bound as block-FP8
  int bf16_linears = 0;                 // Linear parts bound as BF16
};

Result<ModelWeights> bind_host_weights(const Checkpoint& checkpoint, const ModelConfig& config,
                                       BindReport* report = nullptr);

}  // namespace qvl
