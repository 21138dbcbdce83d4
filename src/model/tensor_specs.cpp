#include "model/tensor_specs.h"

namespace qvl {
namespace {

class SpecBuilder {
 public:
  SpecBuilder(const QuantConfig& quant, std::vector<TensorSpec>* out) : quant_(quant), out_(out) {}

  void add(const std::string& name, std::vector<int64_t> shape, WeightPart part, DType dtype = DType::kBF16) {
    out_->push_back({name, dtype, std::move(shape), part});
  }
  // A Linear `module` [out, in] (+ bias [out]); FP8 weight + scale grid when quantized.
  void linear(const std::string& module, int64_t out, int64_t in, bool bias, WeightPart part) {
    if (part != WeightPart::kLmHead && is_fp8_linear(quant_, module)) {
      add(module + ".weight", {out, in}, part, DType::kF8E4M3);
      const int b = quant_.weight_block_size[0];
      add(module + ".weight_scale_inv", {fp8_scale_blocks(out, b), fp8_scale_blocks(in, b)}, part, kFp8ScaleDType);
    } else {
      add(module + ".weight", {out, in}, part);
    }
    if (bias) add(module + ".bias", {out}, part);
  }
  void layer_norm(const std::string& module, int64_t n, WeightPart part) {
    add(module + ".weight", {n}, part);
    add(module + ".bias", {n}, part);
  }

 private:
  const QuantConfig& quant_;
  std::vector<TensorSpec>* out_;
};

}  // namespace

const char* weight_part_name(WeightPart part) {
  switch (part) {
    case WeightPart::kVision:
      return "vision tower";
    case WeightPart::kText:
      return "text decoder";
    case WeightPart::kEmbedding:
      return "embeddings";
    case WeightPart::kLmHead:
      return "lm_head";
  }
  return "?";
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool is_fp8_linear(const QuantConfig& quant, const std::string& module) {
  if (!quant.fp8 || module == "lm_head") return false;
  for (const auto& key : quant.modules_to_not_convert) {
    if (key.empty()) continue;
    bool prefix = module.compare(0, key.size(), key) == 0;
    bool suffix = module.size() >= key.size() && module.compare(module.size() - key.size(), key.size(), key) == 0;
    if (prefix || suffix) return false;
  }
  return true;
}

std::vector<TensorSpec> checkpoint_tensor_specs(const ModelConfig& c) {
  std::vector<TensorSpec> specs;
  SpecBuilder b(c.quant, &specs);
  const VisionConfig& v = c.vision;
  const int64_t D = v.hidden_size, F = v.intermediate_size, O = v.out_hidden_size, M = D * v.merge_unit();
  const auto V = WeightPart::kVision;
  // Conv3d kernel [D, C, T, P, P]; never quantized (not an nn.Linear).
  b.add("model.visual.patch_embed.proj.weight", {D, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size},
        V);
  b.add("model.visual.patch_embed.proj.bias", {D}, V);
  b.add("model.visual.pos_embed.weight", {v.num_position_embeddings, D}, V);
  for (int i = 0; i < v.depth; ++i) {
    const std::string p = "model.visual.blocks." + std::to_string(i) + ".";
    b.layer_norm(p + "norm1", D, V);
    b.layer_norm(p + "norm2", D, V);
    b.linear(p + "attn.qkv", 3 * D, D, true, V);
    b.linear(p + "attn.proj", D, D, true, V);
    b.linear(p + "mlp.linear_fc1", F, D, true, V);
    b.linear(p + "mlp.linear_fc2", D, F, true, V);
  }
  b.layer_norm("model.visual.merger.norm", D, V);  // before the 2x2 concat
  b.linear("model.visual.merger.linear_fc1", M, M, true, V);
  b.linear("model.visual.merger.linear_fc2", O, M, true, V);
  for (size_t k = 0; k < v.deepstack_visual_indexes.size(); ++k) {
    const std::string p = "model.visual.deepstack_merger_list." + std::to_string(k) + ".";
    b.layer_norm(p + "norm", M, V);  // after the 2x2 concat
    b.linear(p + "linear_fc1", M, M, true, V);
    b.linear(p + "linear_fc2", O, M, true, V);
  }

  const TextConfig& t = c.text;
  const int64_t H = t.hidden_size, I = t.intermediate_size;
  const auto T = WeightPart::kText;
  b.add("model.language_model.embed_tokens.weight", {t.vocab_size, H}, WeightPart::kEmbedding);
  for (int l = 0; l < t.num_hidden_layers; ++l) {
    const std::string p = "model.language_model.layers." + std::to_string(l) + ".";
    b.add(p + "input_layernorm.weight", {H}, T);
    b.linear(p + "self_attn.q_proj", t.q_dim(), H, false, T);
    b.linear(p + "self_attn.k_proj", t.kv_dim(), H, false, T);
    b.linear(p + "self_attn.v_proj", t.kv_dim(), H, false, T);
    b.linear(p + "self_attn.o_proj", H, t.q_dim(), false, T);
    b.add(p + "self_attn.q_norm.weight", {t.head_dim}, T);
    b.add(p + "self_attn.k_norm.weight", {t.head_dim}, T);
    b.add(p + "post_attention_layernorm.weight", {H}, T);
    b.linear(p + "mlp.gate_proj", I, H, false, T);
    b.linear(p + "mlp.up_proj", I, H, false, T);
    b.linear(p + "mlp.down_proj", H, I, false, T);
  }
  b.add("model.language_model.norm.weight", {H}, T);
  if (!c.tie_word_embeddings) b.linear("lm_head", t.vocab_size, H, false, WeightPart::kLmHead);
  return specs;
}

std::vector<std::string> official_fp8_skip_modules(const ModelConfig& c) {
  std::vector<std::string> m{"lm_head", "model.visual.patch_embed.proj", "model.visual.pos_embed"};
  for (int i = 0; i < c.vision.depth; ++i) {
    const std::string p = "model.visual.blocks." + std::to_string(i) + ".";
    for (const char* s : {"attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2"}) m.push_back(p + s);
  }
  m.push_back("model.visual.merger.linear_fc1");
  m.push_back("model.visual.merger.linear_fc2");
  for (size_t k = 0; k < c.vision.deepstack_visual_indexes.size(); ++k) {
    const std::string p = "model.visual.deepstack_merger_list." + std::to_string(k) + ".";
    m.push_back(p + "linear_fc1");
    m.push_back(p + "linear_fc2");
  }
  return m;
}

}  // namespace qvl
