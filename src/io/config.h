// config.json, generation_config.json and preprocessor_config.json -> ModelConfig
// (model/config.h), resolved the way transformers 5.17 resolves them:
//   - rope: `rope_scaling` (v4 spelling) or `rope_parameters` (v5; may carry rope_theta);
//     a top-level text `rope_theta` fills in when the dict has none;
//   - tie_word_embeddings: the top-level value (default false); Qwen3VLConfig has no
//     fallback to text_config.tie_word_embeddings, so a disagreeing text_config value is only
//     warned about;
//   - vision `num_attention_heads` is an alias of `num_heads`; the quantization skip list may be
//     spelled `ignored_layers`;
//   - absent optional fields take the transformers class defaults; absent shape fields
//     (hidden sizes, layer and head counts) are an error rather than a silent 8B-sized default;
//   - generation_config.json absent -> transformers' GenerationConfig defaults (greedy) with
//     the config's eos; present -> its fields over those defaults; eos may be an int or a list;
//   - preprocessor_config.json: size.shortest_edge / size.longest_edge are min / max pixel
//     counts; top-level min_pixels / max_pixels override them.
// validate_model_config() is the single list of what qvl supports; every rejection names the
// field and the value ("text_config.attention_bias = true: ..."). The writers produce the
// official file layout (spec §1.1 key names, rope_scaling spelling) for gen-model.
#pragma once

#include <string>

#include "core/status.h"
#include "model/config.h"

namespace qvl {

inline constexpr const char* kConfigFileName = "config.json";
inline constexpr const char* kGenerationConfigFileName = "generation_config.json";
inline constexpr const char* kPreprocessorConfigFileName = "preprocessor_config.json";

// Parses the text of config.json (`source` names the file in errors) and validates it.
// generation and preprocessor fields keep their defaults.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);
// Parses generation_config.json over transformers' GenerationConfig defaults; an absent eos
// falls back to `config_eos`.
Result<GenerationDefaults> parse_generation_config(const std::string& json_text, const std::string& source,
                                                   int config_eos);
// transformers' defaults when a checkpoint has no generation_config.json.
GenerationDefaults default_generation_config(int config_eos);
// Parses preprocessor_config.json over the Qwen3-VL defaults.
Result<PreprocessorConfig> parse_preprocessor_config(const std::string& json_text, const std::string& source);

// Reads <dir>/config.json (required) and the two optional files, then validates the whole.
Result<ModelConfig> load_model_config(const std::string& model_dir);

// Everything qvl requires of a configuration (architecture, supported values, consistent
// shapes). Called by the parsers and by the presets' tests.
Status validate_model_config(const ModelConfig& config);

// ---- writers (official layout, deterministic key order) ----
std::string model_config_to_json(const ModelConfig& config);
std::string generation_config_to_json(const GenerationDefaults& gen, int bos_token_id);
std::string preprocessor_config_to_json(const PreprocessorConfig& pre);

}  // namespace qvl
