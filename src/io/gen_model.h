// gen-model: writes a random-weight Qwen3-VL checkpoint in the exact official file layout:
// config.json, generation_config.json, preprocessor_config.json, video_preprocessor_config.json,
// chat_template.json and the tokenizer files when given, and sharded
// model-0000k-of-0000n.safetensors + model.safetensors.index.json holding exactly the tensors
// of model/tensor_specs.h (BF16; block-FP8 text Linears with weight_scale_inv when the config
// is quantized).
//
// Values are a pure function of (seed, tensor name, element index): a counter-based integer
// hash gives 16 random bits per element, which are scaled by a BF16 step (so every product is
// exact in float and no fused multiply-add or library function can change a bit) and rounded
// to BF16. The output is therefore identical across machines, thread counts and builds, and
// the FP8 checkpoint of a seed is exactly the 128x128 block quantisation of the BF16
// checkpoint of the same seed. Scales (see gen_model.cpp) keep activations finite and give
// logits a spread of a few units.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "model/config.h"
#include "model/tensor_specs.h"

namespace qvl {

struct GenModelOptions {
  uint64_t seed = 0;
  uint64_t max_shard_bytes = 5000000000ull;  // as the official checkpoints ("5GB")
  std::string tokenizer_dir;                 // copies tokenizer.json + tokenizer_config.json ("" = skip)
  std::string chat_template_path;            // copies to chat_template.json when the file exists
  int num_threads = 0;                       // 0 = OpenMP default
};

// Shard limit gen-model uses for the tiny presets, small enough for >= 2 shards.
inline constexpr uint64_t kTinyMaxShardBytes = 16ull << 20;

// Writes the checkpoint for `config` into `out_dir` (created; existing files are overwritten).
Status generate_model(const ModelConfig& config, const GenModelOptions& options, const std::string& out_dir);

// The value gen-model stores for element `index` of tensor `spec` before dtype conversion
// (a BF16 tensor stores exactly this value; an FP8 weight its block quantisation). For tests.
float gen_model_value(const TensorSpec& spec, uint64_t seed, int64_t index);

}  // namespace qvl
