// Writers for the official configuration files (gen-model). Keys are sorted, as transformers
// writes them (json.dumps(sort_keys=True)), so the output is deterministic byte for byte.
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "io/config.h"

namespace qvl {
namespace {

using json = nlohmann::json;

// A float written as its shortest decimal (0.8f -> 0.8, not 0.800000011920929).
json float_value(float f) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), f);
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

// Integral values (rope_theta 5000000) are written as integers, as the official files have them.
json number_value(double d) {
  if (std::floor(d) == d && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  return d;
}

}  // namespace

std::string model_config_to_json(const ModelConfig& c) {
  const TextConfig& t = c.text;
  const VisionConfig& v = c.vision;
  json text = {
      {"attention_bias", t.attention_bias},
      {"attention_dropout", 0.0},
      {"bos_token_id", c.tokens.bos_token_id},
      {"dtype", c.torch_dtype},
      {"eos_token_id", c.tokens.eos_token_id},
      {"head_dim", t.head_dim},
      {"hidden_act", t.hidden_act},
      {"hidden_size", t.hidden_size},
      {"initializer_range", 0.02},
      {"intermediate_size", t.intermediate_size},
      {"max_position_embeddings", t.max_position_embeddings},
      {"model_type", "qwen3_vl_text"},
      {"num_attention_heads", t.num_attention_heads},
      {"num_hidden_layers", t.num_hidden_layers},
      {"num_key_value_heads", t.num_key_value_heads},
      {"rms_norm_eps", t.rms_norm_eps},
      {"rope_scaling",
       {{"mrope_interleaved", t.mrope_interleaved},
        {"mrope_section", {t.mrope_section[0], t.mrope_section[1], t.mrope_section[2]}},
        {"rope_type", "default"}}},
      {"rope_theta", number_value(t.rope_theta)},
      {"use_cache", true},
      {"vocab_size", t.vocab_size},
  };
  // The tied official checkpoints (2B/4B) repeat the flag in text_config; the 8B omits it.
  if (c.tie_word_embeddings) text["tie_word_embeddings"] = true;
  json vision = {
      {"deepstack_visual_indexes", v.deepstack_visual_indexes},
      {"depth", v.depth},
      {"hidden_act", v.hidden_act},
      {"hidden_size", v.hidden_size},
      {"in_channels", v.in_channels},
      {"initializer_range", 0.02},
      {"intermediate_size", v.intermediate_size},
      {"model_type", "qwen3_vl"},
      {"num_heads", v.num_heads},
      {"num_position_embeddings", v.num_position_embeddings},
      {"out_hidden_size", v.out_hidden_size},
      {"patch_size", v.patch_size},
      {"spatial_merge_size", v.spatial_merge_size},
      {"temporal_patch_size", v.temporal_patch_size},
  };
  json root = {
      {"architectures", {c.architecture}},
      {"image_token_id", c.tokens.image_token_id},
      {"model_type", "qwen3_vl"},
      {"text_config", text},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"transformers_version", "4.57.0.dev0"},
      {"video_token_id", c.tokens.video_token_id},
      {"vision_config", vision},
      {"vision_end_token_id", c.tokens.vision_end_token_id},
      {"vision_start_token_id", c.tokens.vision_start_token_id},
  };
  if (c.quant.fp8) {
    root["quantization_config"] = {
        {"activation_scheme", c.quant.activation_scheme},
        {"fmt", c.quant.fmt},
        {"modules_to_not_convert", c.quant.modules_to_not_convert},
        {"quant_method", "fp8"},
        {"weight_block_size", {c.quant.weight_block_size[0], c.quant.weight_block_size[1]}},
    };
  }
  return root.dump(2) + "\n";
}

std::string generation_config_to_json(const GenerationDefaults& g, int bos_token_id) {
  json root = {
      {"bos_token_id", bos_token_id},
      {"do_sample", g.do_sample},
      {"eos_token_id", g.eos_token_ids},
      {"repetition_penalty", float_value(g.repetition_penalty)},
      {"temperature", float_value(g.temperature)},
      {"top_k", g.top_k},
      {"top_p", float_value(g.top_p)},
      {"transformers_version", "4.56.0"},
  };
  if (g.pad_token_id >= 0) root["pad_token_id"] = g.pad_token_id;
  return root.dump(2) + "\n";
}

std::string preprocessor_config_to_json(const PreprocessorConfig& p) {
  json root = {
      {"do_convert_rgb", p.do_convert_rgb},
      {"do_normalize", p.do_normalize},
      {"do_rescale", p.do_rescale},
      {"do_resize", p.do_resize},
      {"image_mean", {float_value(p.image_mean[0]), float_value(p.image_mean[1]), float_value(p.image_mean[2])}},
      {"image_processor_type", "Qwen2VLImageProcessorFast"},
      {"image_std", {float_value(p.image_std[0]), float_value(p.image_std[1]), float_value(p.image_std[2])}},
      {"merge_size", p.merge_size},
      {"patch_size", p.patch_size},
      {"processor_class", "Qwen3VLProcessor"},
      {"resample", 3},
      {"rescale_factor", p.rescale_factor},
      {"size", {{"longest_edge", p.max_pixels}, {"shortest_edge", p.min_pixels}}},
      {"temporal_patch_size", p.temporal_patch_size},
  };
  return root.dump(2) + "\n";
}

}  // namespace qvl
