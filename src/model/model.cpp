// Qwen3VLModel construction: the config/weights agreement checks and small helpers shared by
// the vision (vision.cpp) and text (text.cpp) halves of the forward pass.
#include "model/model.h"

#include <cmath>
#include <string>

namespace qvl {
namespace {

std::string num(int64_t v) {
  return std::to_string(v);
}

// "<what>: <got> != <expected>" when they differ.
Status expect_eq(const std::string& what, int64_t got, int64_t expected) {
  if (got == expected) return Status::ok();
  return invalid_argument(what + " is " + num(got) + ", expected " + num(expected));
}

Status check_linear(const std::string& name, const LinearWeight& w, int64_t out, int64_t in) {
  if (w.parts.empty()) return invalid_argument(name + ": missing");
  QVL_RETURN_IF_ERROR(expect_eq(name + " out_features", w.out_features, out));
  return expect_eq(name + " in_features", w.in_features, in);
}

}  // namespace

VisionOutput::Slice VisionOutput::rows(int64_t begin, int64_t end) const {
  Slice s;
  s.embeds = embeds.rows(begin, end);
  for (const Tensor& d : deepstack) s.deepstack.push_back(d.rows(begin, end));
  return s;
}

Qwen3VLModel::Qwen3VLModel(Backend& backend, const ModelConfig& config, ModelWeights weights)
    : backend_(backend), config_(config), weights_(std::move(weights)) {
  mrope_ = make_mrope_spec(config_.text);
  attn_shape_ = {config_.text.num_attention_heads, config_.text.num_key_value_heads, config_.text.head_dim};
  const TextConfig& t = config_.text;
  stack_.shape = attn_shape_;
  stack_.rope = &mrope_;
  stack_.eps = static_cast<float>(t.rms_norm_eps);
  stack_.scale = 1.0f / std::sqrt(static_cast<float>(t.head_dim));
  stack_.hidden = t.hidden_size;
  stack_.intermediate = t.intermediate_size;
  for (const DecoderLayerWeights& w : weights_.text.layers)
    stack_.layers.push_back(
        {&w.input_norm, &w.post_attention_norm, &w.q_norm, &w.k_norm, &w.qkv, &w.o, &w.gate_up, &w.down});
}

Result<std::unique_ptr<Qwen3VLModel>> Qwen3VLModel::create(Backend& backend, const ModelConfig& config,
                                                           ModelWeights weights) {
  const TextConfig& t = config.text;
  const VisionConfig& v = config.vision;
  if (!t.mrope_interleaved) return unimplemented("text_config: only interleaved M-RoPE (Qwen3-VL) is implemented");
  if (t.head_dim % 2 != 0 || t.mrope_section[0] + t.mrope_section[1] + t.mrope_section[2] != t.head_dim / 2)
    return invalid_argument("mrope_section must sum to head_dim / 2 = " + num(t.head_dim / 2));
  if (t.num_key_value_heads <= 0 || t.num_attention_heads % t.num_key_value_heads != 0)
    return invalid_argument("num_attention_heads " + num(t.num_attention_heads) +
                            " is not a multiple of num_key_value_heads " + num(t.num_key_value_heads));
  if (v.num_heads <= 0 || v.hidden_size % v.num_heads != 0 || v.head_dim() % 4 != 0)
    return invalid_argument("vision hidden_size " + num(v.hidden_size) + " / num_heads " + num(v.num_heads) +
                            " must give a head_dim that is a multiple of 4");
  QVL_RETURN_IF_ERROR(expect_eq("vision out_hidden_size", v.out_hidden_size, t.hidden_size));
  if (v.hidden_act != "gelu_pytorch_tanh")
    return unimplemented("vision hidden_act " + v.hidden_act + " (only gelu_pytorch_tanh)");
  if (t.hidden_act != "silu") return unimplemented("text hidden_act " + t.hidden_act + " (only silu)");

  // Vision weights.
  const VisionWeights& vw = weights.vision;
  const int64_t D = v.hidden_size, U = v.merge_unit();
  QVL_RETURN_IF_ERROR(check_linear("vision patch_embed", vw.patch_embed, D, v.patch_dim()));
  QVL_RETURN_IF_ERROR(expect_eq("vision pos_embed rows", vw.pos_embed.dim(0), v.num_position_embeddings));
  QVL_RETURN_IF_ERROR(expect_eq("vision blocks", static_cast<int64_t>(vw.blocks.size()), v.depth));
  for (size_t i = 0; i < vw.blocks.size(); ++i) {
    const VisionBlockWeights& b = vw.blocks[i];
    const std::string p = "vision block " + num(static_cast<int64_t>(i));
    QVL_RETURN_IF_ERROR(check_linear(p + " qkv", b.qkv, 3 * D, D));
    QVL_RETURN_IF_ERROR(check_linear(p + " proj", b.proj, D, D));
    QVL_RETURN_IF_ERROR(check_linear(p + " fc1", b.fc1, v.intermediate_size, D));
    QVL_RETURN_IF_ERROR(check_linear(p + " fc2", b.fc2, D, v.intermediate_size));
  }
  QVL_RETURN_IF_ERROR(expect_eq("deepstack mergers", static_cast<int64_t>(vw.deepstack_mergers.size()),
                                static_cast<int64_t>(v.deepstack_visual_indexes.size())));
  if (static_cast<int>(v.deepstack_visual_indexes.size()) > t.num_hidden_layers)
    return invalid_argument("more deepstack taps than decoder layers");
  for (int idx : v.deepstack_visual_indexes)
    if (idx < 0 || idx >= v.depth) return invalid_argument("deepstack_visual_indexes entry " + num(idx));
  auto check_merger = [&](const std::string& p, const MergerWeights& m) -> Status {
    QVL_RETURN_IF_ERROR(check_linear(p + " fc1", m.fc1, U * D, U * D));
    return check_linear(p + " fc2", m.fc2, v.out_hidden_size, U * D);
  };
  QVL_RETURN_IF_ERROR(check_merger("vision merger", vw.merger));
  if (vw.merger.postshuffle_norm) return invalid_argument("the final merger normalises before the shuffle");
  for (size_t j = 0; j < vw.deepstack_mergers.size(); ++j) {
    QVL_RETURN_IF_ERROR(check_merger("deepstack merger " + num(static_cast<int64_t>(j)), vw.deepstack_mergers[j]));
    if (!vw.deepstack_mergers[j].postshuffle_norm)
      return invalid_argument("deepstack mergers normalise after the shuffle");
  }

  // Text weights.
  const TextWeights& tw = weights.text;
  const int64_t H = t.hidden_size;
  QVL_RETURN_IF_ERROR(expect_eq("decoder layers", static_cast<int64_t>(tw.layers.size()), t.num_hidden_layers));
  QVL_RETURN_IF_ERROR(expect_eq("embed_tokens rows", tw.embed_tokens.dim(0), t.vocab_size));
  for (size_t l = 0; l < tw.layers.size(); ++l) {
    const DecoderLayerWeights& w = tw.layers[l];
    const std::string p = "decoder layer " + num(static_cast<int64_t>(l));
    QVL_RETURN_IF_ERROR(check_linear(p + " qkv", w.qkv, t.q_dim() + 2 * t.kv_dim(), H));
    QVL_RETURN_IF_ERROR(check_linear(p + " o", w.o, H, t.q_dim()));
    QVL_RETURN_IF_ERROR(check_linear(p + " gate_up", w.gate_up, 2LL * t.intermediate_size, H));
    QVL_RETURN_IF_ERROR(check_linear(p + " down", w.down, H, t.intermediate_size));
    QVL_RETURN_IF_ERROR(expect_eq(p + " q_norm size", w.q_norm.numel(), t.head_dim));
    QVL_RETURN_IF_ERROR(expect_eq(p + " k_norm size", w.k_norm.numel(), t.head_dim));
  }
  QVL_RETURN_IF_ERROR(check_linear("lm_head", tw.lm_head, t.vocab_size, H));
  return std::unique_ptr<Qwen3VLModel>(new Qwen3VLModel(backend, config, std::move(weights)));
}

Tensor Qwen3VLModel::upload(Arena& arena, DType dtype, std::initializer_list<int64_t> dims, const void* host) const {
  Tensor t = arena.alloc(dtype, dims);
  backend_.copy_to_device(t, host);
  return t;
}

}  // namespace qvl
