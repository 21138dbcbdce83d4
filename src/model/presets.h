// Named model configurations that need no files: the official 2B / 4B / 8B Instruct
// checkpoints (spec §1.1, exact), optionally with the official block-FP8 quantization_config,
// and three tiny configurations of the same architecture for tests and fixtures:
//   tiny         text H=64, 4 layers, 4/2 heads of 32, I=128, tied; vision depth 4, D=64
//   tiny-untied  text H=96, 3 layers, 6/2 heads of 16, I=192, untied; vision depth 3, D=48
//   tiny-fp8     text H=256, 2 layers, 4/2 heads of 64, I=384, tied, block-FP8 text Linears;
//                vision depth 2, D=128
// All keep the real vocabulary (151936) so the real tokenizer's ids are valid, and the
// official patch / temporal / merge sizes and token ids. Every preset passes
// validate_model_config (io/config.h) and the transformers 5.17 config checks.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"

namespace qvl {

// "tiny", "tiny-untied", "tiny-fp8", "2b", "4b", "8b".
const std::vector<std::string>& preset_names();

// The configuration of preset `name`; `fp8` adds the official FP8 quantization_config
// (tiny-fp8 always has it). Unknown names are an error listing the known ones.
Result<ModelConfig> preset_config(const std::string& name, bool fp8 = false);

// True for the tiny presets (which gen-model shards small and the hub resolves as built-ins).
bool is_tiny_preset(const std::string& name);

// Adds the official block-FP8 quantization_config to `config` (128x128 blocks, dynamic
// activations, vision tower and lm_head kept in BF16).
void make_fp8(ModelConfig* config);

}  // namespace qvl
