#include "io/config.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/log.h"
#include "core/mmap.h"

namespace qvl {
namespace {

using json = nlohmann::json;

// Reads typed fields of one JSON object; errors name "<source>: <prefix><key>".
class Fields {
 public:
  Fields(const json& obj, std::string source, std::string prefix)
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  const json& at(const char* key) const { return obj_.at(key); }
  std::string name(const char* key) const { return prefix_ + key; }
  Status error(const char* key, const std::string& what) const {
    return invalid_argument(source_ + ": " + name(key) + " " + what);
  }
  Status missing(const char* key) const { return error(key, "is missing"); }

  template <typename Int>
  Status get_int(const char* key, Int* out, bool required = false) const {
    if (!has(key)) return required ? missing(key) : Status::ok();
    const json& v = at(key);
    if (!v.is_number_integer()) return error(key, "= " + v.dump() + ": expected an integer");
    if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<Int>::max())
                               : (v.get<int64_t>() < std::numeric_limits<Int>::min() ||
                                  v.get<int64_t>() > std::numeric_limits<Int>::max()))
      return error(key, "= " + v.dump() + ": out of range");
    *out = static_cast<Int>(v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>()) : v.get<int64_t>());
    return Status::ok();
  }
  Status get_double(const char* key, double* out, bool required = false) const {
    if (!has(key)) return required ? missing(key) : Status::ok();
    const json& v = at(key);
    if (!v.is_number()) return error(key, "= " + v.dump() + ": expected a number");
    *out = v.get<double>();
    return Status::ok();
  }
  Status get_float(const char* key, float* out) const {
    double d = *out;
    QVL_RETURN_IF_ERROR(get_double(key, &d));
    *out = static_cast<float>(d);
    return Status::ok();
  }
  Status get_bool(const char* key, bool* out) const {
    if (!has(key)) return Status::ok();
    if (!at(key).is_boolean()) return error(key, "= " + at(key).dump() + ": expected true or false");
    *out = at(key).get<bool>();
    return Status::ok();
  }
  Status get_string(const char* key, std::string* out) const {
    if (!has(key)) return Status::ok();
    if (!at(key).is_string()) return error(key, "= " + at(key).dump() + ": expected a string");
    *out = at(key).get<std::string>();
    return Status::ok();
  }
  Status get_int_list(const char* key, std::vector<int>* out) const {
    if (!has(key)) return Status::ok();
    const json& v = at(key);
    if (!v.is_array()) return error(key, "= " + v.dump() + ": expected a list of integers");
    out->clear();
    for (const json& x : v) {
      if (!x.is_number_integer() || x.get<int64_t>() < std::numeric_limits<int>::min() ||
          x.get<int64_t>() > std::numeric_limits<int>::max())
        return error(key, "= " + v.dump() + ": expected a list of integers");
      out->push_back(static_cast<int>(x.get<int64_t>()));
    }
    return Status::ok();
  }
  // A sub-object (absent -> nullptr; present but not an object -> error).
  Status get_object(const char* key, const json** out) const {
    *out = nullptr;
    if (!has(key)) return Status::ok();
    if (!at(key).is_object()) return error(key, "= " + at(key).dump() + ": expected a JSON object");
    *out = &at(key);
    return Status::ok();
  }

 private:
  const json& obj_;
  std::string source_;
  std::string prefix_;
};

Result<json> parse_json_object(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(source + ": not valid JSON");
  if (!j.is_object()) return invalid_argument(source + ": expected a JSON object at the top level");
  return j;
}

// rope_scaling / rope_parameters of the text config (spec §1.1: v4 spelling vs v5).
Status parse_text_rope(const Fields& f, const std::string& source, TextConfig* t) {
  const json* rope = nullptr;
  const char* key = f.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  QVL_RETURN_IF_ERROR(f.get_object(key, &rope));
  // transformers 5.17's text default_theta, used when neither spelling carries a theta.
  t->rope_theta = 500000.0;
  QVL_RETURN_IF_ERROR(f.get_double("rope_theta", &t->rope_theta));
  t->mrope_section = {24, 20, 20};  // Qwen3VLTextRotaryEmbedding's default
  t->mrope_interleaved = true;
  if (!rope) return Status::ok();
  Fields r(*rope, source, f.name(key) + ".");
  std::string rope_type = "default";
  QVL_RETURN_IF_ERROR(r.get_string("type", &rope_type));  // legacy spelling
  QVL_RETURN_IF_ERROR(r.get_string("rope_type", &rope_type));
  if (rope_type != "default")
    return r.error("rope_type", "= \"" + rope_type + "\": qvl supports only Qwen3-VL's default M-RoPE");
  QVL_RETURN_IF_ERROR(r.get_double("rope_theta", &t->rope_theta));
  double partial = 1.0;
  QVL_RETURN_IF_ERROR(r.get_double("partial_rotary_factor", &partial));
  if (partial != 1.0)
    return r.error("partial_rotary_factor", "= " + std::to_string(partial) + ": qvl supports only full rotation");
  if (r.has("mrope_section")) {
    std::vector<int> sec;
    QVL_RETURN_IF_ERROR(r.get_int_list("mrope_section", &sec));
    if (sec.size() != 3)
      return r.error("mrope_section", "= " + r.at("mrope_section").dump() + ": expected 3 entries (T, H, W)");
    t->mrope_section = {sec[0], sec[1], sec[2]};
  }
  QVL_RETURN_IF_ERROR(r.get_bool("mrope_interleaved", &t->mrope_interleaved));
  if (!t->mrope_interleaved) {
    // Qwen3-VL's rotary embedding interleaves whatever the flag says; follow the model code.
    log_warn(source + ": " + r.name("mrope_interleaved") + " = false is ignored: Qwen3-VL always interleaves M-RoPE");
    t->mrope_interleaved = true;
  }
  return Status::ok();
}

Status parse_text(const json& j, const std::string& source, ModelConfig* c) {
  Fields f(j, source, "text_config.");
  TextConfig& t = c->text;
  QVL_RETURN_IF_ERROR(f.get_int("hidden_size", &t.hidden_size, true));
  QVL_RETURN_IF_ERROR(f.get_int("num_hidden_layers", &t.num_hidden_layers, true));
  QVL_RETURN_IF_ERROR(f.get_int("num_attention_heads", &t.num_attention_heads, true));
  QVL_RETURN_IF_ERROR(f.get_int("intermediate_size", &t.intermediate_size, true));
  QVL_RETURN_IF_ERROR(f.get_int("vocab_size", &t.vocab_size, true));
  t.num_key_value_heads = t.num_attention_heads;  // transformers: None -> num_attention_heads
  QVL_RETURN_IF_ERROR(f.get_int("num_key_value_heads", &t.num_key_value_heads));
  t.head_dim = 128;  // Qwen3VLTextConfig default
  QVL_RETURN_IF_ERROR(f.get_int("head_dim", &t.head_dim));
  t.rms_norm_eps = 1e-6;
  QVL_RETURN_IF_ERROR(f.get_double("rms_norm_eps", &t.rms_norm_eps));
  t.max_position_embeddings = 128000;
  QVL_RETURN_IF_ERROR(f.get_int("max_position_embeddings", &t.max_position_embeddings));
  t.attention_bias = false;
  QVL_RETURN_IF_ERROR(f.get_bool("attention_bias", &t.attention_bias));
  t.hidden_act = "silu";
  QVL_RETURN_IF_ERROR(f.get_string("hidden_act", &t.hidden_act));
  QVL_RETURN_IF_ERROR(f.get_int("bos_token_id", &c->tokens.bos_token_id));
  if (f.has("eos_token_id") && f.at("eos_token_id").is_array()) {
    std::vector<int> eos;
    QVL_RETURN_IF_ERROR(f.get_int_list("eos_token_id", &eos));
    if (eos.empty()) return f.error("eos_token_id", "is an empty list");
    c->tokens.eos_token_id = eos.front();
  } else {
    QVL_RETURN_IF_ERROR(f.get_int("eos_token_id", &c->tokens.eos_token_id));
  }
  std::string dtype;
  QVL_RETURN_IF_ERROR(f.get_string("dtype", &dtype));
  if (!dtype.empty()) c->torch_dtype = dtype;
  return parse_text_rope(f, source, &t);
}

Status parse_vision(const json& j, const std::string& source, VisionConfig* v) {
  Fields f(j, source, "vision_config.");
  QVL_RETURN_IF_ERROR(f.get_int("depth", &v->depth, true));
  QVL_RETURN_IF_ERROR(f.get_int("hidden_size", &v->hidden_size, true));
  QVL_RETURN_IF_ERROR(f.get_int("intermediate_size", &v->intermediate_size, true));
  QVL_RETURN_IF_ERROR(f.get_int("out_hidden_size", &v->out_hidden_size, true));
  if (f.has("num_heads")) {
    QVL_RETURN_IF_ERROR(f.get_int("num_heads", &v->num_heads));
  } else {
    QVL_RETURN_IF_ERROR(f.get_int("num_attention_heads", &v->num_heads, true));  // transformers alias
  }
  // Defaults below are Qwen3VLVisionConfig's.
  v->in_channels = 3, v->patch_size = 16, v->temporal_patch_size = 2, v->spatial_merge_size = 2;
  v->num_position_embeddings = 2304;
  v->deepstack_visual_indexes = {8, 16, 24};
  v->hidden_act = "gelu_pytorch_tanh";
  QVL_RETURN_IF_ERROR(f.get_int("in_channels", &v->in_channels));
  QVL_RETURN_IF_ERROR(f.get_int("patch_size", &v->patch_size));
  QVL_RETURN_IF_ERROR(f.get_int("temporal_patch_size", &v->temporal_patch_size));
  QVL_RETURN_IF_ERROR(f.get_int("spatial_merge_size", &v->spatial_merge_size));
  QVL_RETURN_IF_ERROR(f.get_int("num_position_embeddings", &v->num_position_embeddings));
  QVL_RETURN_IF_ERROR(f.get_int_list("deepstack_visual_indexes", &v->deepstack_visual_indexes));
  QVL_RETURN_IF_ERROR(f.get_string("hidden_act", &v->hidden_act));
  v->rope_theta = 10000.0;  // RotaryEmbeddingConfigMixin.default_theta (axial)
  const json* rope = nullptr;
  QVL_RETURN_IF_ERROR(f.get_object("rope_parameters", &rope));
  if (rope) {
    Fields r(*rope, source, "vision_config.rope_parameters.");
    QVL_RETURN_IF_ERROR(r.get_double("rope_theta", &v->rope_theta));
  }
  return Status::ok();
}

Status parse_quant(const json& j, const std::string& source, QuantConfig* q) {
  Fields f(j, source, "quantization_config.");
  std::string method;
  QVL_RETURN_IF_ERROR(f.get_string("quant_method", &method));
  if (method != "fp8")
    return f.error("quant_method", "= \"" + method +
                                       "\": qvl supports only the block-FP8 format (quant_method \"fp8\") of the "
                                       "official Qwen3-VL FP8 checkpoints");
  q->fp8 = true;
  q->fmt = "e4m3";
  QVL_RETURN_IF_ERROR(f.get_string("fmt", &q->fmt));
  q->activation_scheme = "dynamic";
  QVL_RETURN_IF_ERROR(f.get_string("activation_scheme", &q->activation_scheme));
  std::string scale_fmt = "float";
  QVL_RETURN_IF_ERROR(f.get_string("scale_fmt", &scale_fmt));
  if (scale_fmt != "float")
    return f.error("scale_fmt", "= \"" + scale_fmt + "\": qvl supports only float block scales");
  if (!f.has("weight_block_size"))
    return f.error("weight_block_size", "is missing: qvl supports only block-wise FP8 (per-tensor scales are not)");
  std::vector<int> block;
  QVL_RETURN_IF_ERROR(f.get_int_list("weight_block_size", &block));
  if (block.size() != 2)
    return f.error("weight_block_size", "= " + f.at("weight_block_size").dump() + ": expected two integers");
  q->weight_block_size = {block[0], block[1]};
  const char* skip_key = f.has("modules_to_not_convert") ? "modules_to_not_convert" : "ignored_layers";
  q->modules_to_not_convert.clear();
  if (f.has(skip_key)) {
    if (!f.at(skip_key).is_array()) return f.error(skip_key, "= " + f.at(skip_key).dump() + ": expected a list");
    for (const json& m : f.at(skip_key)) {
      if (!m.is_string()) return f.error(skip_key, "entry " + m.dump() + " is not a string");
      q->modules_to_not_convert.push_back(m.get<std::string>());
    }
  }
  return Status::ok();
}

// The one place that says which architecture and values qvl runs.
Status validate_text(const TextConfig& t, const TokenIds& ids) {
  auto bad = [](const std::string& field, const std::string& what) {
    return invalid_argument("text_config." + field + " " + what);
  };
  auto positive = [&](const char* field, int64_t v) {
    return v > 0 ? Status::ok() : bad(field, "= " + std::to_string(v) + ": must be positive");
  };
  QVL_RETURN_IF_ERROR(positive("hidden_size", t.hidden_size));
  QVL_RETURN_IF_ERROR(positive("num_hidden_layers", t.num_hidden_layers));
  QVL_RETURN_IF_ERROR(positive("num_attention_heads", t.num_attention_heads));
  QVL_RETURN_IF_ERROR(positive("num_key_value_heads", t.num_key_value_heads));
  QVL_RETURN_IF_ERROR(positive("head_dim", t.head_dim));
  QVL_RETURN_IF_ERROR(positive("intermediate_size", t.intermediate_size));
  QVL_RETURN_IF_ERROR(positive("vocab_size", t.vocab_size));
  QVL_RETURN_IF_ERROR(positive("max_position_embeddings", t.max_position_embeddings));
  if (t.attention_bias)
    return bad("attention_bias", "= true: Qwen3-VL attention has no biases; qvl does not support them");
  if (t.hidden_act != "silu") return bad("hidden_act", "= \"" + t.hidden_act + "\": qvl supports only \"silu\"");
  if (t.num_attention_heads % t.num_key_value_heads != 0)
    return bad("num_attention_heads",
               "= " + std::to_string(t.num_attention_heads) +
                   " is not a multiple of num_key_value_heads = " + std::to_string(t.num_key_value_heads));
  if (t.head_dim % 2 != 0) return bad("head_dim", "= " + std::to_string(t.head_dim) + ": must be even for RoPE");
  if (!(t.rms_norm_eps > 0) || !std::isfinite(t.rms_norm_eps))
    return bad("rms_norm_eps", "= " + std::to_string(t.rms_norm_eps) + ": must be a positive number");
  if (!(t.rope_theta > 0) || !std::isfinite(t.rope_theta))
    return bad("rope_theta", "= " + std::to_string(t.rope_theta) + ": must be a positive number");
  const auto& s = t.mrope_section;
  const int half = t.head_dim / 2;
  std::string sec = "[" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) + "]";
  if (s[0] < 0 || s[1] < 0 || s[2] < 0 || s[0] + s[1] + s[2] != half)
    return bad("rope_scaling.mrope_section", "= " + sec + " does not sum to head_dim / 2 = " + std::to_string(half));
  // Interleaved layout: H takes frequencies 1, 4, ..., 3*s1-2 and W takes 2, 5, ..., 3*s2-1;
  // both runs must stay inside the head_dim/2 frequencies (Qwen3VLTextRotaryEmbedding).
  if ((s[1] > 0 && 3 * s[1] - 2 >= half) || (s[2] > 0 && 3 * s[2] - 1 >= half))
    return bad("rope_scaling.mrope_section",
               "= " + sec + " does not fit the interleaved layout of " + std::to_string(half) + " frequencies");
  const std::pair<const char*, int> token_fields[] = {{"image_token_id", ids.image_token_id},
                                                      {"video_token_id", ids.video_token_id},
                                                      {"vision_start_token_id", ids.vision_start_token_id},
                                                      {"vision_end_token_id", ids.vision_end_token_id},
                                                      {"text_config.bos_token_id", ids.bos_token_id},
                                                      {"text_config.eos_token_id", ids.eos_token_id}};
  for (const auto& [name, id] : token_fields) {
    if (id < 0 || id >= t.vocab_size)
      return invalid_argument(std::string(name) + " = " + std::to_string(id) + " is outside vocab_size " +
                              std::to_string(t.vocab_size));
  }
  return Status::ok();
}

Status validate_vision(const VisionConfig& v, const TextConfig& t) {
  auto bad = [](const std::string& field, const std::string& what) {
    return invalid_argument("vision_config." + field + " " + what);
  };
  const std::pair<const char*, int> positives[] = {{"depth", v.depth},
                                                   {"hidden_size", v.hidden_size},
                                                   {"intermediate_size", v.intermediate_size},
                                                   {"num_heads", v.num_heads},
                                                   {"out_hidden_size", v.out_hidden_size},
                                                   {"in_channels", v.in_channels},
                                                   {"patch_size", v.patch_size},
                                                   {"temporal_patch_size", v.temporal_patch_size},
                                                   {"spatial_merge_size", v.spatial_merge_size},
                                                   {"num_position_embeddings", v.num_position_embeddings}};
  for (const auto& [field, value] : positives)
    if (value <= 0) return bad(field, "= " + std::to_string(value) + ": must be positive");
  if (v.hidden_act != "gelu_pytorch_tanh")
    return bad("hidden_act", "= \"" + v.hidden_act + "\": qvl supports only \"gelu_pytorch_tanh\"");
  if (v.hidden_size % v.num_heads != 0)
    return bad("hidden_size", "= " + std::to_string(v.hidden_size) +
                                  " is not a multiple of num_heads = " + std::to_string(v.num_heads));
  if (v.head_dim() % 4 != 0)
    return bad("hidden_size", "/ num_heads = " + std::to_string(v.head_dim()) +
                                  ": the 2-D vision RoPE needs a head size divisible by 4");
  int side = static_cast<int>(std::lround(std::sqrt(static_cast<double>(v.num_position_embeddings))));
  if (side * side != v.num_position_embeddings)
    return bad("num_position_embeddings",
               "= " + std::to_string(v.num_position_embeddings) + " is not a square grid (n x n position embeddings)");
  if (v.out_hidden_size != t.hidden_size)
    return bad("out_hidden_size", "= " + std::to_string(v.out_hidden_size) +
                                      " does not match text_config.hidden_size = " + std::to_string(t.hidden_size));
  if (v.in_channels != 3) return bad("in_channels", "= " + std::to_string(v.in_channels) + ": qvl reads RGB only (3)");
  std::set<int> seen;
  for (int idx : v.deepstack_visual_indexes) {
    if (idx < 0 || idx >= v.depth)
      return bad("deepstack_visual_indexes",
                 "entry " + std::to_string(idx) + " is not a block of depth " + std::to_string(v.depth));
    if (!seen.insert(idx).second)
      return bad("deepstack_visual_indexes", "lists block " + std::to_string(idx) + " twice");
  }
  if (static_cast<int>(v.deepstack_visual_indexes.size()) > t.num_hidden_layers)
    return bad("deepstack_visual_indexes", "has " + std::to_string(v.deepstack_visual_indexes.size()) +
                                               " entries but the decoder only " + std::to_string(t.num_hidden_layers) +
                                               " layers to add them to");
  return Status::ok();
}

Status validate_quant(const QuantConfig& q) {
  if (!q.fp8) return Status::ok();
  if (q.fmt != "e4m3")
    return invalid_argument("quantization_config.fmt = \"" + q.fmt + "\": qvl supports only \"e4m3\"");
  if (q.activation_scheme != "dynamic")
    return invalid_argument("quantization_config.activation_scheme = \"" + q.activation_scheme +
                            "\": qvl supports only \"dynamic\"");
  const auto& b = q.weight_block_size;
  if (b[0] <= 0 || b[0] != b[1])
    return invalid_argument("quantization_config.weight_block_size = [" + std::to_string(b[0]) + ", " +
                            std::to_string(b[1]) + "]: qvl supports only square blocks (e.g. [128, 128])");
  return Status::ok();
}

}  // namespace

Status validate_model_config(const ModelConfig& c) {
  if (c.architecture != "Qwen3VLForConditionalGeneration")
    return invalid_argument("architectures = \"" + c.architecture +
                            "\": qvl runs only Qwen3VLForConditionalGeneration (dense Qwen3-VL)");
  QVL_RETURN_IF_ERROR(validate_text(c.text, c.tokens));
  QVL_RETURN_IF_ERROR(validate_vision(c.vision, c.text));
  QVL_RETURN_IF_ERROR(validate_quant(c.quant));
  const PreprocessorConfig& p = c.preprocessor;
  if (p.patch_size != c.vision.patch_size || p.temporal_patch_size != c.vision.temporal_patch_size ||
      p.merge_size != c.vision.spatial_merge_size)
    return invalid_argument(
        "preprocessor_config patch_size/temporal_patch_size/merge_size = " + std::to_string(p.patch_size) + "/" +
        std::to_string(p.temporal_patch_size) + "/" + std::to_string(p.merge_size) + " do not match vision_config " +
        std::to_string(c.vision.patch_size) + "/" + std::to_string(c.vision.temporal_patch_size) + "/" +
        std::to_string(c.vision.spatial_merge_size));
  if (p.min_pixels <= 0 || p.max_pixels < p.min_pixels)
    return invalid_argument("preprocessor_config size.shortest_edge / longest_edge = " + std::to_string(p.min_pixels) +
                            " / " + std::to_string(p.max_pixels) + ": need 0 < min_pixels <= max_pixels");
  for (int i = 0; i < 3; ++i)
    if (!(p.image_std[i] > 0))
      return invalid_argument("preprocessor_config image_std[" + std::to_string(i) +
                              "] = " + std::to_string(p.image_std[i]) + ": must be positive");
  return Status::ok();
}

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  QVL_ASSIGN_OR_RETURN(json j, parse_json_object(json_text, source));
  Fields f(j, source, "");
  ModelConfig c;
  if (f.has("architectures")) {
    const json& a = f.at("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string())
      return f.error("architectures", "= " + a.dump() + ": expected a list of class names");
    c.architecture = a[0].get<std::string>();
  }
  std::string model_type = "qwen3_vl";
  QVL_RETURN_IF_ERROR(f.get_string("model_type", &model_type));
  if (model_type != "qwen3_vl")
    return f.error("model_type", "= \"" + model_type + "\": qvl runs only \"qwen3_vl\" (dense Qwen3-VL)");
  const json *text = nullptr, *vision = nullptr, *quant = nullptr;
  QVL_RETURN_IF_ERROR(f.get_object("text_config", &text));
  QVL_RETURN_IF_ERROR(f.get_object("vision_config", &vision));
  QVL_RETURN_IF_ERROR(f.get_object("quantization_config", &quant));
  if (!text) return f.missing("text_config");
  if (!vision) return f.missing("vision_config");
  QVL_RETURN_IF_ERROR(parse_text(*text, source, &c));
  QVL_RETURN_IF_ERROR(parse_vision(*vision, source, &c.vision));
  if (quant) QVL_RETURN_IF_ERROR(parse_quant(*quant, source, &c.quant));
  QVL_RETURN_IF_ERROR(f.get_int("image_token_id", &c.tokens.image_token_id));
  QVL_RETURN_IF_ERROR(f.get_int("video_token_id", &c.tokens.video_token_id));
  QVL_RETURN_IF_ERROR(f.get_int("vision_start_token_id", &c.tokens.vision_start_token_id));
  QVL_RETURN_IF_ERROR(f.get_int("vision_end_token_id", &c.tokens.vision_end_token_id));
  // transformers 5.17 ties on the top-level flag only (default false), see the header.
  c.tie_word_embeddings = false;
  QVL_RETURN_IF_ERROR(f.get_bool("tie_word_embeddings", &c.tie_word_embeddings));
  bool text_tie = c.tie_word_embeddings;
  QVL_RETURN_IF_ERROR(Fields(*text, source, "text_config.").get_bool("tie_word_embeddings", &text_tie));
  if (text_tie != c.tie_word_embeddings)
    log_warn(source + ": text_config.tie_word_embeddings = " + (text_tie ? "true" : "false") +
             " is ignored; the top-level tie_word_embeddings = " + (c.tie_word_embeddings ? "true" : "false") +
             " decides (as in transformers 5.17)");
  QVL_RETURN_IF_ERROR(f.get_string("torch_dtype", &c.torch_dtype));
  QVL_RETURN_IF_ERROR(f.get_string("dtype", &c.torch_dtype));
  Status v = validate_model_config(c);
  if (!v.is_ok()) return v.with_context(source);
  return c;
}

GenerationDefaults default_generation_config(int config_eos) {
  GenerationDefaults g;  // transformers GenerationConfig() defaults: greedy
  g.eos_token_ids = {config_eos};
  g.pad_token_id = -1;
  g.do_sample = false;
  g.temperature = 1.0f;
  g.top_p = 1.0f;
  g.top_k = 50;
  g.repetition_penalty = 1.0f;
  return g;
}

Result<GenerationDefaults> parse_generation_config(const std::string& text, const std::string& source, int config_eos) {
  QVL_ASSIGN_OR_RETURN(json j, parse_json_object(text, source));
  Fields f(j, source, "");
  GenerationDefaults g = default_generation_config(config_eos);
  if (f.has("eos_token_id")) {
    if (f.at("eos_token_id").is_array()) {
      QVL_RETURN_IF_ERROR(f.get_int_list("eos_token_id", &g.eos_token_ids));
      if (g.eos_token_ids.empty()) return f.error("eos_token_id", "is an empty list");
    } else {
      int eos = 0;
      QVL_RETURN_IF_ERROR(f.get_int("eos_token_id", &eos));
      g.eos_token_ids = {eos};
    }
  }
  QVL_RETURN_IF_ERROR(f.get_int("pad_token_id", &g.pad_token_id));
  QVL_RETURN_IF_ERROR(f.get_bool("do_sample", &g.do_sample));
  QVL_RETURN_IF_ERROR(f.get_float("temperature", &g.temperature));
  QVL_RETURN_IF_ERROR(f.get_float("top_p", &g.top_p));
  QVL_RETURN_IF_ERROR(f.get_int("top_k", &g.top_k));
  QVL_RETURN_IF_ERROR(f.get_float("repetition_penalty", &g.repetition_penalty));
  if (!(g.temperature >= 0)) return f.error("temperature", "= " + std::to_string(g.temperature) + ": must be >= 0");
  if (!(g.top_p > 0 && g.top_p <= 1)) return f.error("top_p", "= " + std::to_string(g.top_p) + ": must be in (0, 1]");
  if (g.top_k < 0) return f.error("top_k", "= " + std::to_string(g.top_k) + ": must be >= 0");
  if (!(g.repetition_penalty > 0))
    return f.error("repetition_penalty", "= " + std::to_string(g.repetition_penalty) + ": must be positive");
  return g;
}

Result<PreprocessorConfig> parse_preprocessor_config(const std::string& text, const std::string& source) {
  QVL_ASSIGN_OR_RETURN(json j, parse_json_object(text, source));
  Fields f(j, source, "");
  PreprocessorConfig p;
  const json* size = nullptr;
  QVL_RETURN_IF_ERROR(f.get_object("size", &size));
  if (size) {
    Fields s(*size, source, "size.");
    QVL_RETURN_IF_ERROR(s.get_int("shortest_edge", &p.min_pixels));
    QVL_RETURN_IF_ERROR(s.get_int("longest_edge", &p.max_pixels));
  }
  // Qwen2VLImageProcessor: top-level min_pixels / max_pixels override size.
  QVL_RETURN_IF_ERROR(f.get_int("min_pixels", &p.min_pixels));
  QVL_RETURN_IF_ERROR(f.get_int("max_pixels", &p.max_pixels));
  QVL_RETURN_IF_ERROR(f.get_int("patch_size", &p.patch_size));
  QVL_RETURN_IF_ERROR(f.get_int("temporal_patch_size", &p.temporal_patch_size));
  QVL_RETURN_IF_ERROR(f.get_int("merge_size", &p.merge_size));
  for (const char* key : {"image_mean", "image_std"}) {
    if (!f.has(key)) continue;
    const json& v = f.at(key);
    if (!v.is_array() || v.size() != 3 || !v[0].is_number() || !v[1].is_number() || !v[2].is_number())
      return f.error(key, "= " + v.dump() + ": expected 3 numbers (R, G, B)");
    auto& dst = std::string(key) == "image_mean" ? p.image_mean : p.image_std;
    for (int i = 0; i < 3; ++i) dst[i] = v[i].get<float>();
  }
  QVL_RETURN_IF_ERROR(f.get_double("rescale_factor", &p.rescale_factor));
  QVL_RETURN_IF_ERROR(f.get_bool("do_resize", &p.do_resize));
  QVL_RETURN_IF_ERROR(f.get_bool("do_rescale", &p.do_rescale));
  QVL_RETURN_IF_ERROR(f.get_bool("do_normalize", &p.do_normalize));
  QVL_RETURN_IF_ERROR(f.get_bool("do_convert_rgb", &p.do_convert_rgb));
  int resample = 3;
  QVL_RETURN_IF_ERROR(f.get_int("resample", &resample));
  if (resample != 3) return f.error("resample", "= " + std::to_string(resample) + ": qvl implements only 3 (bicubic)");
  return p;
}

Result<ModelConfig> load_model_config(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(dir) / kConfigFileName).string();
  std::error_code ec;
  if (!fs::exists(config_path, ec)) return not_found(config_path + " not found (every model directory needs one)");
  QVL_ASSIGN_OR_RETURN(std::string text, read_file(config_path));
  QVL_ASSIGN_OR_RETURN(ModelConfig c, parse_model_config(text, config_path));

  const std::string gen_path = (fs::path(dir) / kGenerationConfigFileName).string();
  if (fs::exists(gen_path, ec)) {
    QVL_ASSIGN_OR_RETURN(std::string gtext, read_file(gen_path));
    QVL_ASSIGN_OR_RETURN(c.generation, parse_generation_config(gtext, gen_path, c.tokens.eos_token_id));
  } else {
    log_info(gen_path + " not found: using transformers' generation defaults (greedy)");
    c.generation = default_generation_config(c.tokens.eos_token_id);
  }
  const std::string pre_path = (fs::path(dir) / kPreprocessorConfigFileName).string();
  if (fs::exists(pre_path, ec)) {
    QVL_ASSIGN_OR_RETURN(std::string ptext, read_file(pre_path));
    QVL_ASSIGN_OR_RETURN(c.preprocessor, parse_preprocessor_config(ptext, pre_path));
  } else {
    log_info(pre_path + " not found: using the Qwen3-VL image preprocessing defaults");
  }
  Status v = validate_model_config(c);
  if (!v.is_ok()) return v.with_context(dir);
  return c;
}

}  // namespace qvl
