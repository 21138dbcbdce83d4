// Typed Qwen3-VL configuration: exactly the fields the model, the planner and the
// preprocessor use, read from config.json, generation_config.json and
// preprocessor_config.json by io/config.cpp. Defaults are the official checkpoints' values so a
// preset (2b/4b/8b/tiny) can be built without files (model/presets.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace qvl {

struct TextConfig {
  int hidden_size = 2048;            // H
  int num_hidden_layers = 28;
  int num_attention_heads = 16;      // Hq
  int num_key_value_heads = 8;       // Hkv
  int head_dim = 128;
  int intermediate_size = 6144;      // I
  int vocab_size = 151936;
  double rms_norm_eps = 1e-6;
  double rope_theta = 5000000.0;
  std::array<int, 3> mrope_section{24, 20, 20};  // frequencies per axis (T, H, W)
  bool mrope_interleaved = true;
  int64_t max_position_embeddings = 262144;
  bool attention_bias = false;       // Qwen3-VL: false; true is rejected at load
  std::string hidden_act = "silu";

  int q_dim() const { return num_attention_heads * head_dim; }
  int kv_dim() const { return num_key_value_heads * head_dim; }
};

struct VisionConfig {
  int depth = 24;
  int hidden_size = 1024;            // D
  int intermediate_size = 4096;      // F
  int num_heads = 16;
  int out_hidden_size = 2048;        // O (= text hidden_size)
  int in_channels = 3;
  int patch_size = 16;
  int temporal_patch_size = 2;
  int spatial_merge_size = 2;
  int num_position_embeddings = 2304;  // a square grid: 48 x 48
  std::vector<int> deepstack_visual_indexes{5, 11, 17};
  std::string hidden_act = "gelu_pytorch_tanh";
  double layer_norm_eps = 1e-6;
  double rope_theta = 10000.0;

  int head_dim() const { return hidden_size / num_heads; }
  // Flattened patch length: C * T * P * P (1536 for the official models).
  int patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int merge_unit() const { return spatial_merge_size * spatial_merge_size; }
  // The longest grid side (in patches) `num_patches` patches allow: h, w >= spatial_merge_size
  // and t·h·w <= num_patches, so a grid merge-size patches high (the rotary angle rows the
  // encoder allocates: model/positions.h write_vision_factors).
  int64_t max_grid_side(int64_t num_patches) const { return num_patches / spatial_merge_size; }
};

// Block-FP8 Linears (quantization_config, quant_method "fp8").
struct QuantConfig {
  bool fp8 = false;
  std::string fmt = "e4m3";
  std::string activation_scheme = "dynamic";
  std::array<int, 2> weight_block_size{128, 128};
  std::vector<std::string> modules_to_not_convert;
};

struct TokenIds {
  int image_token_id = 151655;        // <|image_pad|>
  int video_token_id = 151656;        // <|video_pad|>
  int vision_start_token_id = 151652; // <|vision_start|>
  int vision_end_token_id = 151653;   // <|vision_end|>
  int bos_token_id = 151643;
  int eos_token_id = 151645;
};

// generation_config.json
struct GenerationDefaults {
  std::vector<int> eos_token_ids{151645, 151643};
  int pad_token_id = 151643;
  bool do_sample = true;
  float temperature = 0.7f;
  float top_p = 0.8f;
  int top_k = 20;
  float repetition_penalty = 1.0f;
};

// preprocessor_config.json (Qwen2VLImageProcessor as configured for Qwen3-VL).
struct PreprocessorConfig {
  int64_t min_pixels = 65536;     // size.shortest_edge (a pixel count, not an edge)
  int64_t max_pixels = 16777216;  // size.longest_edge
  int patch_size = 16;
  int temporal_patch_size = 2;
  int merge_size = 2;
  std::array<float, 3> image_mean{0.5f, 0.5f, 0.5f};
  std::array<float, 3> image_std{0.5f, 0.5f, 0.5f};
  double rescale_factor = 1.0 / 255.0;
  bool do_resize = true;
  bool do_rescale = true;
  bool do_normalize = true;
  bool do_convert_rgb = true;
};

struct ModelConfig {
  std::string architecture = "Qwen3VLForConditionalGeneration";
  TextConfig text;
  VisionConfig vision;
  QuantConfig quant;
  TokenIds tokens;
  bool tie_word_embeddings = true;
  std::string torch_dtype = "bfloat16";
  GenerationDefaults generation;
  PreprocessorConfig preprocessor;
};

}  // namespace qvl
