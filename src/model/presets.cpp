#include "model/presets.h"

#include "model/tensor_specs.h"

namespace qvl {
namespace {

struct Shape {
  // text
  int hidden, layers, heads, kv_heads, head_dim, intermediate;
  std::array<int, 3> mrope;
  bool tied;
  // vision
  int depth, vhidden, vintermediate, vheads, positions;
  std::vector<int> deepstack;
};

ModelConfig from_shape(const Shape& s) {
  ModelConfig c;  // defaults: the official vocabulary, token ids, patch sizes, rope theta, eps
  c.text.hidden_size = s.hidden;
  c.text.num_hidden_layers = s.layers;
  c.text.num_attention_heads = s.heads;
  c.text.num_key_value_heads = s.kv_heads;
  c.text.head_dim = s.head_dim;
  c.text.intermediate_size = s.intermediate;
  c.text.mrope_section = s.mrope;
  c.tie_word_embeddings = s.tied;
  c.vision.depth = s.depth;
  c.vision.hidden_size = s.vhidden;
  c.vision.intermediate_size = s.vintermediate;
  c.vision.num_heads = s.vheads;
  c.vision.out_hidden_size = s.hidden;
  c.vision.num_position_embeddings = s.positions;
  c.vision.deepstack_visual_indexes = s.deepstack;
  return c;
}

// Spec §1.1 (2B / 4B / 8B) and the tiny shapes. mrope sections sum to head_dim / 2.
const std::pair<const char*, Shape> kPresets[] = {
    {"tiny", {64, 4, 4, 2, 32, 128, {6, 5, 5}, true, 4, 64, 128, 4, 64, {0, 2}}},
    {"tiny-untied", {96, 3, 6, 2, 16, 192, {4, 2, 2}, false, 3, 48, 96, 3, 36, {1}}},
    {"tiny-fp8", {256, 2, 4, 2, 64, 384, {12, 10, 10}, true, 2, 128, 256, 2, 64, {0}}},
    {"2b", {2048, 28, 16, 8, 128, 6144, {24, 20, 20}, true, 24, 1024, 4096, 16, 2304, {5, 11, 17}}},
    {"4b", {2560, 36, 32, 8, 128, 9728, {24, 20, 20}, true, 24, 1024, 4096, 16, 2304, {5, 11, 17}}},
    {"8b", {4096, 36, 32, 8, 128, 12288, {24, 20, 20}, false, 27, 1152, 4304, 16, 2304, {8, 16, 24}}},
};

}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& [name, shape] : kPresets) n.push_back(name);
    return n;
  }();
  return names;
}

bool is_tiny_preset(const std::string& name) {
  return name == "tiny" || name == "tiny-untied" || name == "tiny-fp8";
}

void make_fp8(ModelConfig* c) {
  c->quant.fp8 = true;
  c->quant.fmt = "e4m3";
  c->quant.activation_scheme = "dynamic";
  c->quant.weight_block_size = {128, 128};
  c->quant.modules_to_not_convert = official_fp8_skip_modules(*c);
}

Result<ModelConfig> preset_config(const std::string& name, bool fp8) {
  for (const auto& [preset, shape] : kPresets) {
    if (name != preset) continue;
    ModelConfig c = from_shape(shape);
    if (fp8 || name == "tiny-fp8") make_fp8(&c);
    return c;
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  return invalid_argument("unknown preset '" + name + "' (known: " + known + ")");
}

}  // namespace qvl
