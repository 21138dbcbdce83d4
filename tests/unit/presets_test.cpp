// Presets (model/presets.h) and the official tensor list (model/tensor_specs.h), checked
// against the numbers in the spec: §1.1 shapes, §1.3 FP8 scale grids, §2 8B totals.
#include "model/presets.h"

#include <gtest/gtest.h>

#include <map>

#include "io/config.h"
#include "model/tensor_specs.h"

namespace qvl {
namespace {

std::map<std::string, TensorSpec> by_name(const ModelConfig& c) {
  std::map<std::string, TensorSpec> m;
  for (auto& s : checkpoint_tensor_specs(c)) m[s.name] = s;
  return m;
}

TEST(Presets, AllValidate) {
  for (const auto& name : preset_names()) {
    for (bool fp8 : {false, true}) {
      auto c = preset_config(name, fp8);
      ASSERT_TRUE(c.is_ok()) << name;
      Status s = validate_model_config(*c);
      EXPECT_TRUE(s.is_ok()) << name << ": " << s.to_string();
      EXPECT_EQ(c->text.vocab_size, 151936) << name;
      EXPECT_EQ(c->vision.patch_size, 16);
      EXPECT_EQ(c->vision.temporal_patch_size, 2);
      EXPECT_EQ(c->vision.spatial_merge_size, 2);
      // What transformers' Qwen3VLTextRotaryEmbedding assumes.
      const auto& s3 = c->text.mrope_section;
      EXPECT_EQ(s3[0] + s3[1] + s3[2], c->text.head_dim / 2) << name;
    }
  }
  EXPECT_FALSE(preset_config("3b").is_ok());
  EXPECT_NE(preset_config("3b").status().message().find("tiny, tiny-untied, tiny-fp8, 2b, 4b, 8b"), std::string::npos);
}

TEST(Presets, TinyShapesAsSpecified) {
  auto t = *preset_config("tiny");
  EXPECT_EQ(t.text.hidden_size, 64);
  EXPECT_EQ(t.text.num_hidden_layers, 4);
  EXPECT_EQ(t.text.q_dim(), 4 * 32);
  EXPECT_EQ(t.text.kv_dim(), 2 * 32);
  EXPECT_EQ(t.vision.head_dim(), 16);
  EXPECT_EQ(t.vision.deepstack_visual_indexes, (std::vector<int>{0, 2}));
  EXPECT_TRUE(t.tie_word_embeddings);
  EXPECT_FALSE(t.quant.fp8);
  auto u = *preset_config("tiny-untied");
  EXPECT_FALSE(u.tie_word_embeddings);
  EXPECT_EQ(u.vision.num_position_embeddings, 36);
  EXPECT_EQ(u.vision.out_hidden_size, 96);
  auto f = *preset_config("tiny-fp8");
  EXPECT_TRUE(f.quant.fp8);
  EXPECT_EQ(f.vision.head_dim(), 64);
  EXPECT_EQ(f.text.mrope_section, (std::array<int, 3>{12, 10, 10}));
}

TEST(TensorSpecs, Official8bTotals) {
  auto specs = checkpoint_tensor_specs(*preset_config("8b"));
  // Spec §2: "750 tensors, 8,767,123,696 params".
  EXPECT_EQ(specs.size(), 750u);
  int64_t params = 0;
  for (auto& s : specs) params += s.numel();
  EXPECT_EQ(params, 8767123696LL);
  auto m = by_name(*preset_config("8b"));
  EXPECT_EQ(m.at("model.visual.patch_embed.proj.weight").shape, (std::vector<int64_t>{1152, 3, 2, 16, 16}));
  EXPECT_EQ(m.at("model.visual.merger.linear_fc1.weight").shape, (std::vector<int64_t>{4608, 4608}));
  EXPECT_EQ(m.at("model.visual.deepstack_merger_list.2.norm.weight").shape, (std::vector<int64_t>{4608}));
  EXPECT_EQ(m.at("lm_head.weight").part, WeightPart::kLmHead);
}

TEST(TensorSpecs, TiedHasNoLmHead) {
  auto m = by_name(*preset_config("2b"));
  EXPECT_EQ(m.count("lm_head.weight"), 0u);
  EXPECT_EQ(m.at("model.language_model.embed_tokens.weight").shape, (std::vector<int64_t>{151936, 2048}));
  EXPECT_EQ(m.at("model.language_model.layers.27.self_attn.k_proj.weight").shape, (std::vector<int64_t>{1024, 2048}));
}

// Spec §1.3 scale grids, per model.
TEST(TensorSpecs, Fp8ScaleGridsMatchTheOfficialCheckpoints) {
  struct Case {
    const char* preset;
    std::map<std::string, std::vector<int64_t>> scales;  // module under layers.N -> grid
  };
  const Case cases[] = {
      {"8b",
       {{"self_attn.q_proj", {32, 32}},
        {"self_attn.k_proj", {8, 32}},
        {"self_attn.v_proj", {8, 32}},
        {"self_attn.o_proj", {32, 32}},
        {"mlp.gate_proj", {96, 32}},
        {"mlp.up_proj", {96, 32}},
        {"mlp.down_proj", {32, 96}}}},
      {"4b",
       {{"self_attn.q_proj", {32, 20}},
        {"self_attn.k_proj", {8, 20}},
        {"self_attn.v_proj", {8, 20}},
        {"self_attn.o_proj", {20, 32}},
        {"mlp.gate_proj", {76, 20}},
        {"mlp.up_proj", {76, 20}},
        {"mlp.down_proj", {20, 76}}}},
      {"2b",
       {{"self_attn.q_proj", {16, 16}},
        {"self_attn.k_proj", {8, 16}},
        {"self_attn.v_proj", {8, 16}},
        {"self_attn.o_proj", {16, 16}},
        {"mlp.gate_proj", {48, 16}},
        {"mlp.up_proj", {48, 16}},
        {"mlp.down_proj", {16, 48}}}},
  };
  for (const auto& cs : cases) {
    auto m = by_name(*preset_config(cs.preset, /*fp8=*/true));
    for (const auto& [proj, grid] : cs.scales) {
      const std::string mod = "model.language_model.layers.3." + proj;
      ASSERT_TRUE(m.count(mod + ".weight_scale_inv")) << cs.preset << " " << mod;
      EXPECT_EQ(m.at(mod + ".weight_scale_inv").shape, grid) << cs.preset << " " << mod;
      EXPECT_EQ(m.at(mod + ".weight_scale_inv").dtype, kFp8ScaleDType);
      EXPECT_EQ(m.at(mod + ".weight").dtype, DType::kF8E4M3);
    }
    // The vision tower, embeddings, norms and lm_head stay BF16.
    EXPECT_EQ(m.at("model.visual.blocks.0.attn.qkv.weight").dtype, DType::kBF16) << cs.preset;
    EXPECT_EQ(m.count("model.visual.blocks.0.attn.qkv.weight_scale_inv"), 0u);
    EXPECT_EQ(m.at("model.visual.merger.linear_fc2.weight").dtype, DType::kBF16);
    EXPECT_EQ(m.at("model.language_model.embed_tokens.weight").dtype, DType::kBF16);
    EXPECT_EQ(m.at("model.language_model.layers.0.input_layernorm.weight").dtype, DType::kBF16);
  }
  auto m8 = by_name(*preset_config("8b", true));
  EXPECT_EQ(m8.at("lm_head.weight").dtype, DType::kBF16);
  EXPECT_EQ(m8.count("lm_head.weight_scale_inv"), 0u);
}

TEST(TensorSpecs, SkipListMatchesPrefixOrSuffixLikeTransformers) {
  QuantConfig q;
  q.fp8 = true;
  q.modules_to_not_convert = {"model.visual", "down_proj"};
  EXPECT_FALSE(is_fp8_linear(q, "model.visual.blocks.3.attn.qkv"));               // prefix
  EXPECT_FALSE(is_fp8_linear(q, "model.language_model.layers.0.mlp.down_proj"));  // suffix
  EXPECT_TRUE(is_fp8_linear(q, "model.language_model.layers.0.mlp.up_proj"));
  EXPECT_FALSE(is_fp8_linear(q, "lm_head"));  // never quantized
  q.fp8 = false;
  EXPECT_FALSE(is_fp8_linear(q, "model.language_model.layers.0.mlp.up_proj"));
}

}  // namespace
}  // namespace qvl
