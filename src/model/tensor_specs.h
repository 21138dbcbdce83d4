// The official checkpoint layout of Qwen3-VL as a list: every tensor name, dtype and shape for
// a configuration (spec §2), plus the FP8 weight and weight_scale_inv tensors of a block-FP8
// checkpoint (spec §1.3). gen-model writes exactly this list, model/bind.cpp checks a
// checkpoint against it, and the memory planner sums it for the exact weight bytes, so the
// three can never disagree.
//
// Which Linears are FP8 follows transformers' FineGrainedFP8 quantizer: every nn.Linear
// (not the Conv3d patch embedding, not the embeddings) unless its module name matches an
// entry of quantization_config.modules_to_not_convert (as a prefix, a prefix followed by a
// dot, or a suffix of the name; transformers reads the entries as regexes, qvl as literals,
// which agree for plain module names), and never lm_head (transformers always keeps the
// output embedding in high precision).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace qvl {

// Which part of the model a tensor belongs to (for check-model's summary and the planner).
enum class WeightPart : uint8_t { kVision, kText, kEmbedding, kLmHead };
const char* weight_part_name(WeightPart part);  // "vision tower", "text decoder", ...

struct TensorSpec {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  WeightPart part = WeightPart::kText;

  int64_t numel() const;
  uint64_t nbytes() const { return static_cast<uint64_t>(numel()) * dtype_size(dtype); }
};

// The dtype gen-model writes for weight_scale_inv. The official Qwen FP8 checkpoints
// (Qwen3-32B-FP8, Qwen3.5/3.6-FP8 family format) store BF16 scales; binding accepts F32 too.
inline constexpr DType kFp8ScaleDType = DType::kBF16;

// Every tensor of the official checkpoint for `config`, in model order (vision tower, text
// embeddings, decoder layers, final norm, lm_head when untied).
std::vector<TensorSpec> checkpoint_tensor_specs(const ModelConfig& config);

// Whether the Linear module `module` (e.g. "model.language_model.layers.0.mlp.up_proj") is
// stored block-FP8 under `quant` (see the header comment).
bool is_fp8_linear(const QuantConfig& quant, const std::string& module);

// The modules_to_not_convert list of the official Qwen3-VL FP8 checkpoints for `config`:
// lm_head and every module of the vision tower.
std::vector<std::string> official_fp8_skip_modules(const ModelConfig& config);

// Elements of a [rows, cols] weight's scale grid: ceil(rows / block) x ceil(cols / block).
inline int64_t fp8_scale_blocks(int64_t n, int block) {
  return (n + block - 1) / block;
}

}  // namespace qvl
