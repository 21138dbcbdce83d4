// config.json / generation_config.json / preprocessor_config.json parsing (io/config.h).
// The base text is the verbatim 8B config.json of spec §1.1.
#include "io/config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/presets.h"

namespace qvl {
namespace {

using json = nlohmann::json;

const char* k8bConfig =
    R"({"architectures":["Qwen3VLForConditionalGeneration"],"image_token_id":151655,"model_type":"qwen3_vl",
 "text_config":{"attention_bias":false,"attention_dropout":0.0,"bos_token_id":151643,"dtype":"bfloat16",
  "eos_token_id":151645,"head_dim":128,"hidden_act":"silu","hidden_size":4096,"initializer_range":0.02,
  "intermediate_size":12288,"max_position_embeddings":262144,"model_type":"qwen3_vl_text",
  "num_attention_heads":32,"num_hidden_layers":36,"num_key_value_heads":8,"rms_norm_eps":1e-06,
  "rope_scaling":{"mrope_interleaved":true,"mrope_section":[24,20,20],"rope_type":"default"},
  "rope_theta":5000000,"use_cache":true,"vocab_size":151936},
 "tie_word_embeddings":false,"transformers_version":"4.57.0.dev0","video_token_id":151656,
 "vision_config":{"deepstack_visual_indexes":[8,16,24],"depth":27,"hidden_act":"gelu_pytorch_tanh",
  "hidden_size":1152,"in_channels":3,"initializer_range":0.02,"intermediate_size":4304,"model_type":"qwen3_vl",
  "num_heads":16,"num_position_embeddings":2304,"out_hidden_size":4096,"patch_size":16,
  "spatial_merge_size":2,"temporal_patch_size":2},
 "vision_end_token_id":151653,"vision_start_token_id":151652})";

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

// Parses k8bConfig after `edit` and returns the error message (or "" when it parses).
template <typename Edit>
std::string error_after(Edit edit) {
  json j = json::parse(k8bConfig);
  edit(j);
  auto r = parse_model_config(j.dump(), "/m/config.json");
  return r.is_ok() ? "" : r.status().message();
}

TEST(Config, Parses8bV4Spelling) {
  auto r = parse_model_config(k8bConfig, "/m/config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.text.hidden_size, 4096);
  EXPECT_EQ(c.text.num_hidden_layers, 36);
  EXPECT_EQ(c.text.num_attention_heads, 32);
  EXPECT_EQ(c.text.num_key_value_heads, 8);
  EXPECT_EQ(c.text.intermediate_size, 12288);
  EXPECT_EQ(c.text.rope_theta, 5000000.0);
  EXPECT_EQ(c.text.mrope_section, (std::array<int, 3>{24, 20, 20}));
  EXPECT_EQ(c.text.max_position_embeddings, 262144);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.vision.depth, 27);
  EXPECT_EQ(c.vision.hidden_size, 1152);
  EXPECT_EQ(c.vision.deepstack_visual_indexes, (std::vector<int>{8, 16, 24}));
  EXPECT_EQ(c.tokens.image_token_id, 151655);
  EXPECT_EQ(c.tokens.eos_token_id, 151645);
  EXPECT_FALSE(c.quant.fp8);
}

TEST(Config, ParsesV5RopeParametersWithThetaInside) {
  json j = json::parse(k8bConfig);
  auto& t = j["text_config"];
  t.erase("rope_scaling");
  t.erase("rope_theta");
  t["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", 1000000.0},
                          {"mrope_section", {22, 21, 21}},
                          {"mrope_interleaved", true}};
  auto r = parse_model_config(j.dump(), "c");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->text.rope_theta, 1000000.0);
  EXPECT_EQ(r->text.mrope_section, (std::array<int, 3>{22, 21, 21}));
}

TEST(Config, MropeSectionMustFitTheInterleavedLayout) {
  // [16, 24, 24] sums to 64 but H would need frequency 3*24-2 = 70 of 64: transformers would
  // silently use 21 H frequencies, so qvl refuses it.
  json j = json::parse(k8bConfig);
  j["text_config"]["rope_scaling"]["mrope_section"] = {16, 24, 24};
  auto r = parse_model_config(j.dump(), "c");
  ASSERT_FALSE(r.is_ok());
  EXPECT_CONTAINS(r.status().message(), "mrope_section = [16, 24, 24] does not fit the interleaved layout of 64");
}

TEST(Config, RopeThetaDefaultsLikeTransformers) {
  json j = json::parse(k8bConfig);
  j["text_config"].erase("rope_theta");
  auto r = parse_model_config(j.dump(), "c");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->text.rope_theta, 500000.0);  // Qwen3VLTextConfig.default_theta
}

TEST(Config, TieWordEmbeddingsFollowsTopLevel) {
  json j = json::parse(k8bConfig);
  j["tie_word_embeddings"] = true;
  auto r = parse_model_config(j.dump(), "c");
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(r->tie_word_embeddings);
  // transformers 5.17: only the top-level flag counts; absent means untied.
  j.erase("tie_word_embeddings");
  j["text_config"]["tie_word_embeddings"] = true;
  r = parse_model_config(j.dump(), "c");
  ASSERT_TRUE(r.is_ok());
  EXPECT_FALSE(r->tie_word_embeddings);
}

TEST(Config, ParsesFp8QuantizationConfig) {
  json j = json::parse(k8bConfig);
  j["quantization_config"] = {{"activation_scheme", "dynamic"},
                              {"fmt", "e4m3"},
                              {"quant_method", "fp8"},
                              {"weight_block_size", {128, 128}},
                              {"modules_to_not_convert", {"lm_head", "model.visual.blocks.0.attn.qkv"}}};
  auto r = parse_model_config(j.dump(), "c");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(r->quant.fp8);
  EXPECT_EQ(r->quant.weight_block_size, (std::array<int, 2>{128, 128}));
  EXPECT_EQ(r->quant.modules_to_not_convert, (std::vector<std::string>{"lm_head", "model.visual.blocks.0.attn.qkv"}));
  // The MiniMax-style alias.
  j["quantization_config"].erase("modules_to_not_convert");
  j["quantization_config"]["ignored_layers"] = {"lm_head"};
  r = parse_model_config(j.dump(), "c");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->quant.modules_to_not_convert, (std::vector<std::string>{"lm_head"}));
}

TEST(Config, ErrorsNameTheFieldAndValue) {
  EXPECT_CONTAINS(error_after([](json& j) { j["text_config"]["attention_bias"] = true; }),
                  "/m/config.json: text_config.attention_bias = true");
  EXPECT_CONTAINS(error_after([](json& j) { j["text_config"]["hidden_act"] = "gelu"; }),
                  "text_config.hidden_act = \"gelu\"");
  EXPECT_CONTAINS(error_after([](json& j) {
                    j["text_config"]["rope_scaling"]["mrope_section"] = {24, 20, 16};
                  }),
                  "mrope_section = [24, 20, 16] does not sum to head_dim / 2 = 64");
  EXPECT_CONTAINS(error_after([](json& j) { j["vision_config"]["num_position_embeddings"] = 2300; }),
                  "vision_config.num_position_embeddings = 2300 is not a square grid");
  EXPECT_CONTAINS(error_after([](json& j) { j["architectures"] = {"Qwen3VLMoeForConditionalGeneration"}; }),
                  "architectures = \"Qwen3VLMoeForConditionalGeneration\"");
  EXPECT_CONTAINS(error_after([](json& j) { j["model_type"] = "qwen3_vl_moe"; }), "model_type = \"qwen3_vl_moe\"");
  EXPECT_CONTAINS(error_after([](json& j) { j["text_config"].erase("hidden_size"); }),
                  "/m/config.json: text_config.hidden_size is missing");
  EXPECT_CONTAINS(error_after([](json& j) { j["text_config"]["num_hidden_layers"] = "36"; }),
                  "text_config.num_hidden_layers = \"36\": expected an integer");
  EXPECT_CONTAINS(error_after([](json& j) { j["text_config"]["rope_scaling"]["rope_type"] = "yarn"; }),
                  "text_config.rope_scaling.rope_type = \"yarn\"");
  EXPECT_CONTAINS(error_after([](json& j) { j["vision_config"]["out_hidden_size"] = 2048; }),
                  "vision_config.out_hidden_size = 2048 does not match text_config.hidden_size = 4096");
  EXPECT_CONTAINS(error_after([](json& j) {
                    j["vision_config"]["deepstack_visual_indexes"] = {8, 30};
                  }),
                  "vision_config.deepstack_visual_indexes entry 30 is not a block of depth 27");
  EXPECT_CONTAINS(error_after([](json& j) { j["image_token_id"] = 200000; }),
                  "image_token_id = 200000 is outside vocab_size 151936");
  EXPECT_CONTAINS(error_after([](json& j) {
                    j["quantization_config"] = {{"quant_method", "awq"}};
                  }),
                  "quantization_config.quant_method = \"awq\"");
  EXPECT_CONTAINS(
      error_after([](json& j) {
        j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e5m2"}, {"weight_block_size", {128, 128}}};
      }),
      "quantization_config.fmt = \"e5m2\"");
  EXPECT_CONTAINS(error_after([](json& j) {
                    j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 64}}};
                  }),
                  "quantization_config.weight_block_size = [128, 64]");
  EXPECT_CONTAINS(error_after([](json& j) {
                    j["quantization_config"] = {
                        {"quant_method", "fp8"}, {"activation_scheme", "static"}, {"weight_block_size", {128, 128}}};
                  }),
                  "quantization_config.activation_scheme = \"static\"");
  EXPECT_CONTAINS(error_after([](json& j) { j.erase("text_config"); }), "text_config is missing");
  auto r = parse_model_config("{not json", "/m/config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_CONTAINS(r.status().message(), "/m/config.json: not valid JSON");
}

TEST(GenerationConfig, EosIsIntOrList) {
  auto g = parse_generation_config(
      R"({"bos_token_id":151643,"pad_token_id":151643,"do_sample":true,"eos_token_id":[151645,151643],
          "top_k":20,"top_p":0.8,"repetition_penalty":1.0,"temperature":0.7,"transformers_version":"4.56.0"})",
      "g", 151645);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ(g->eos_token_ids, (std::vector<int>{151645, 151643}));
  EXPECT_TRUE(g->do_sample);
  EXPECT_EQ(g->top_k, 20);
  EXPECT_FLOAT_EQ(g->top_p, 0.8f);
  EXPECT_FLOAT_EQ(g->temperature, 0.7f);
  EXPECT_EQ(g->pad_token_id, 151643);

  g = parse_generation_config(R"({"eos_token_id":7})", "g", 151645);
  ASSERT_TRUE(g.is_ok());
  EXPECT_EQ(g->eos_token_ids, (std::vector<int>{7}));
  // Absent fields take transformers' GenerationConfig defaults.
  EXPECT_FALSE(g->do_sample);
  EXPECT_EQ(g->top_k, 50);
  EXPECT_FLOAT_EQ(g->temperature, 1.0f);

  g = parse_generation_config(R"({})", "g", 151645);
  ASSERT_TRUE(g.is_ok());
  EXPECT_EQ(g->eos_token_ids, (std::vector<int>{151645}));  // falls back to the config's eos

  g = parse_generation_config(R"({"eos_token_id":"x"})", "/m/generation_config.json", 1);
  ASSERT_FALSE(g.is_ok());
  EXPECT_CONTAINS(g.status().message(), "/m/generation_config.json: eos_token_id = \"x\"");
  g = parse_generation_config(R"({"top_p":1.5})", "g", 1);
  ASSERT_FALSE(g.is_ok());
  EXPECT_CONTAINS(g.status().message(), "top_p");
}

TEST(PreprocessorConfig, SizeIsPixelCountsAndMinMaxOverride) {
  auto p = parse_preprocessor_config(
      R"({"size":{"shortest_edge":65536,"longest_edge":16777216},"patch_size":16,"temporal_patch_size":2,
          "merge_size":2,"image_mean":[0.5,0.5,0.5],"image_std":[0.5,0.5,0.5],"resample":3})",
      "p");
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->min_pixels, 65536);
  EXPECT_EQ(p->max_pixels, 16777216);
  p = parse_preprocessor_config(R"({"size":{"shortest_edge":65536,"longest_edge":16777216},"min_pixels":3136,
                                    "max_pixels":1003520})",
                                "p");
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(p->min_pixels, 3136);
  EXPECT_EQ(p->max_pixels, 1003520);
  p = parse_preprocessor_config(R"({"image_mean":[0.5,0.5]})", "/m/preprocessor_config.json");
  ASSERT_FALSE(p.is_ok());
  EXPECT_CONTAINS(p.status().message(), "/m/preprocessor_config.json: image_mean = [0.5,0.5]");
  p = parse_preprocessor_config(R"({"resample":2})", "p");
  ASSERT_FALSE(p.is_ok());
  EXPECT_CONTAINS(p.status().message(), "resample = 2");
}

TEST(ConfigWriter, RoundTripsEveryPreset) {
  for (const auto& name : preset_names()) {
    for (bool fp8 : {false, true}) {
      auto c = preset_config(name, fp8);
      ASSERT_TRUE(c.is_ok());
      auto back = parse_model_config(model_config_to_json(*c), name);
      ASSERT_TRUE(back.is_ok()) << name << ": " << back.status().to_string();
      EXPECT_EQ(back->text.hidden_size, c->text.hidden_size) << name;
      EXPECT_EQ(back->text.mrope_section, c->text.mrope_section) << name;
      EXPECT_EQ(back->text.rope_theta, c->text.rope_theta) << name;
      EXPECT_EQ(back->vision.deepstack_visual_indexes, c->vision.deepstack_visual_indexes) << name;
      EXPECT_EQ(back->tie_word_embeddings, c->tie_word_embeddings) << name;
      EXPECT_EQ(back->quant.fp8, c->quant.fp8) << name;
      EXPECT_EQ(back->quant.modules_to_not_convert, c->quant.modules_to_not_convert) << name;
    }
  }
  GenerationDefaults g;
  auto gb = parse_generation_config(generation_config_to_json(g, 151643), "g", 0);
  ASSERT_TRUE(gb.is_ok());
  EXPECT_EQ(gb->eos_token_ids, g.eos_token_ids);
  EXPECT_EQ(gb->top_k, g.top_k);
  EXPECT_EQ(gb->temperature, g.temperature);
  EXPECT_NE(generation_config_to_json(g, 151643).find("\"top_p\": 0.8,"), std::string::npos);
  PreprocessorConfig p;
  auto pb = parse_preprocessor_config(preprocessor_config_to_json(p), "p");
  ASSERT_TRUE(pb.is_ok());
  EXPECT_EQ(pb->min_pixels, p.min_pixels);
  EXPECT_EQ(pb->max_pixels, p.max_pixels);
}

}  // namespace
}  // namespace qvl
