// Weight binding (model/bind.h) on generated tiny checkpoints: the typed tree's shapes and
// formats, tied vs untied lm_head, FP8 detection, and every problem reported together.
#include "model/bind.h"

#include <gtest/gtest.h>

#include "io/checkpoint.h"
#include "io/config.h"
#include "unit/io_test_util.h"

namespace qvl {
namespace {

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

Result<ModelWeights> bind_dir(const std::string& dir, BindReport* report = nullptr, ModelConfig* cfg_out = nullptr) {
  auto config = load_model_config(dir);
  if (!config.is_ok()) return config.status();
  auto ck = Checkpoint::open(dir);
  if (!ck.is_ok()) return ck.status();
  if (cfg_out) *cfg_out = *config;
  return bind_host_weights(*ck, *config, report);
}

TEST(Bind, TinyTreeHasTheModelShapes) {
  BindReport report;
  auto w = bind_dir(test::shared_preset("tiny"), &report);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  const VisionWeights& v = w->vision;
  ASSERT_EQ(v.blocks.size(), 4u);
  // Conv3d [64, 3, 2, 16, 16] viewed as a Linear [64, 1536].
  EXPECT_EQ(v.patch_embed.parts[0].weight.ndim, 2);
  EXPECT_EQ(v.patch_embed.parts[0].weight.shape[1], 1536);
  EXPECT_EQ(v.patch_embed.in_features, 1536);
  EXPECT_EQ(v.blocks[2].qkv.out_features, 3 * 64);
  EXPECT_EQ(v.blocks[2].qkv.bias.shape[0], 3 * 64);
  EXPECT_EQ(v.pos_embed.shape[0], 64);
  EXPECT_FALSE(v.merger.postshuffle_norm);
  EXPECT_EQ(v.merger.norm_w.shape[0], 64);  // before the 2x2 concat
  ASSERT_EQ(v.deepstack_mergers.size(), 2u);
  EXPECT_TRUE(v.deepstack_mergers[1].postshuffle_norm);
  EXPECT_EQ(v.deepstack_mergers[1].norm_w.shape[0], 256);  // 4D, after the concat
  const TextWeights& t = w->text;
  ASSERT_EQ(t.layers.size(), 4u);
  const DecoderLayerWeights& l = t.layers[3];
  ASSERT_EQ(l.qkv.parts.size(), 3u);
  EXPECT_EQ(l.qkv.parts[0].weight.shape[0], 128);  // q: 4 heads x 32
  EXPECT_EQ(l.qkv.parts[1].weight.shape[0], 64);   // k: 2 heads x 32
  EXPECT_EQ(l.qkv.out_features, 128 + 64 + 64);
  EXPECT_EQ(l.qkv.in_features, 64);
  ASSERT_EQ(l.gate_up.parts.size(), 2u);
  EXPECT_EQ(l.gate_up.out_features, 256);
  EXPECT_EQ(l.down.in_features, 128);
  EXPECT_EQ(l.q_norm.shape[0], 32);
  EXPECT_TRUE(l.qkv.bias.empty());
  EXPECT_FALSE(l.qkv.is_fp8());
  // Tied: lm_head is the embedding table itself.
  EXPECT_TRUE(t.lm_head_tied);
  EXPECT_EQ(t.lm_head.parts[0].weight.data, t.embed_tokens.data);
  EXPECT_EQ(t.lm_head.out_features, 151936);
  EXPECT_FALSE(w->keep_alive.empty());
  EXPECT_TRUE(report.unexpected.empty());
  EXPECT_EQ(report.fp8_linears, 0);
  // Checkpoint Linears (the Conv3d patch embedding is not one): vision 4 blocks x 4 + merger
  // 2 + 2 deepstack mergers x 2; text 4 layers x 7 (q, k, v, o, gate, up, down).
  EXPECT_EQ(report.bf16_linears, 4 * 4 + 2 + 2 * 2 + 4 * 7);
}

TEST(Bind, UntiedNeedsLmHead) {
  auto w = bind_dir(test::shared_preset("tiny-untied"));
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_FALSE(w->text.lm_head_tied);
  EXPECT_NE(w->text.lm_head.parts[0].weight.data, w->text.embed_tokens.data);
  EXPECT_EQ(w->text.lm_head.parts[0].weight.shape[1], 96);

  std::string dir = test::copy_of(test::shared_preset("tiny-untied"), "bind_no_lm_head");
  test::edit_header(test::shard_of(dir, "lm_head.weight"), [](nlohmann::json& h) { h.erase("lm_head.weight"); });
  auto index = nlohmann::json::parse(test::slurp(dir + "/model.safetensors.index.json"));
  index["weight_map"].erase("lm_head.weight");
  test::spit(dir + "/model.safetensors.index.json", index.dump());
  auto bad = bind_dir(dir);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_CONTAINS(bad.status().message(), "lm_head.weight: missing (expected BF16 [151936, 96])");
}

TEST(Bind, TiedIgnoresAStoredLmHead) {
  // The untied checkpoint read with tie_word_embeddings = true: lm_head.weight is ignored.
  std::string dir = test::copy_of(test::shared_preset("tiny-untied"), "bind_tied_extra");
  auto cfg = nlohmann::json::parse(test::slurp(dir + "/config.json"));
  cfg["tie_word_embeddings"] = true;
  test::spit(dir + "/config.json", cfg.dump());
  BindReport report;
  auto w = bind_dir(dir, &report);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_TRUE(report.lm_head_ignored);
  EXPECT_TRUE(report.unexpected.empty());
  EXPECT_EQ(w->text.lm_head.parts[0].weight.data, w->text.embed_tokens.data);
}

TEST(Bind, Fp8LinearsCarryTheirScales) {
  BindReport report;
  auto w = bind_dir(test::shared_preset("tiny-fp8"), &report);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  const DecoderLayerWeights& l = w->text.layers[1];
  EXPECT_TRUE(l.qkv.is_fp8());
  EXPECT_EQ(l.qkv.block_size, 128);
  EXPECT_EQ(l.qkv.parts[1].scale_inv.shape[0], 1);  // k [128, 256] -> [1, 2]
  EXPECT_EQ(l.qkv.parts[1].scale_inv.shape[1], 2);
  EXPECT_EQ(l.down.parts[0].scale_inv.shape[1], 3);  // down [256, 384] -> [2, 3]
  EXPECT_FALSE(w->vision.blocks[0].qkv.is_fp8());
  EXPECT_FALSE(w->text.lm_head.is_fp8());
  EXPECT_EQ(report.fp8_linears, 2 * 7);
}

TEST(Bind, Fp8ScalesMayBeF16) {
  // Some official Qwen FP8 checkpoints store F16 scales; same bytes as BF16, other dtype.
  std::string dir = test::copy_of(test::shared_preset("tiny-fp8"), "bind_fp8_f16");
  const std::string scale = "model.language_model.layers.1.self_attn.o_proj.weight_scale_inv";
  test::edit_header(test::shard_of(dir, scale), [&](nlohmann::json& h) { h[scale]["dtype"] = "F16"; });
  auto w = bind_dir(dir);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ(w->text.layers[1].o.parts[0].scale_inv.dtype, DType::kF16);
}

TEST(Bind, Fp8WeightNeedsScaleAndQuantConfig) {
  std::string dir = test::copy_of(test::shared_preset("tiny-fp8"), "bind_fp8_bad");
  const std::string scale = "model.language_model.layers.0.mlp.up_proj.weight_scale_inv";
  test::edit_header(test::shard_of(dir, scale), [&](nlohmann::json& h) { h.erase(scale); });
  auto index = nlohmann::json::parse(test::slurp(dir + "/model.safetensors.index.json"));
  index["weight_map"].erase(scale);
  test::spit(dir + "/model.safetensors.index.json", index.dump());
  auto w = bind_dir(dir);
  ASSERT_FALSE(w.is_ok());
  EXPECT_CONTAINS(w.status().message(), scale +
                                            ": missing (expected F32, BF16 or F16 [3, 2] for the F8_E4M3 "
                                            "model.language_model.layers.0.mlp.up_proj.weight)");

  auto cfg = nlohmann::json::parse(test::slurp(dir + "/config.json"));
  cfg.erase("quantization_config");
  test::spit(dir + "/config.json", cfg.dump());
  w = bind_dir(dir);
  ASSERT_FALSE(w.is_ok());
  EXPECT_CONTAINS(w.status().message(),
                  "model.language_model.layers.1.self_attn.q_proj.weight: F8_E4M3 in " + dir +
                      "/model-00003-of-00003.safetensors but config.json has no quantization_config");
}

TEST(Bind, Bf16CheckpointUnderAnFp8ConfigBindsAsBf16) {
  // The checkpoint decides: BF16 weights stay BF16 Linears.
  std::string dir = test::copy_of(test::shared_preset("tiny"), "bind_bf16_fp8cfg");
  auto cfg = nlohmann::json::parse(test::slurp(dir + "/config.json"));
  cfg["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
  test::spit(dir + "/config.json", cfg.dump());
  BindReport report;
  auto w = bind_dir(dir, &report);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ(report.fp8_linears, 0);
  EXPECT_FALSE(w->text.layers[0].qkv.is_fp8());
}

TEST(Bind, ReportsEveryProblemTogether) {
  // The tiny checkpoint against a config with a wider MLP and one more layer: 4 layers x 3
  // MLP shapes wrong + every tensor of layer 4 missing (11), one line each.
  std::string dir = test::copy_of(test::shared_preset("tiny"), "bind_many");
  auto cfg = nlohmann::json::parse(test::slurp(dir + "/config.json"));
  cfg["text_config"]["intermediate_size"] = 192;
  cfg["text_config"]["num_hidden_layers"] = 5;
  test::spit(dir + "/config.json", cfg.dump());
  auto w = bind_dir(dir);
  ASSERT_FALSE(w.is_ok());
  const std::string& m = w.status().message();
  EXPECT_CONTAINS(m, "23 problems binding the checkpoint in " + dir);
  EXPECT_CONTAINS(m, "\n  model.language_model.layers.0.mlp.up_proj.weight: BF16 [128, 64] in " + dir +
                         "/model-00003-of-00003.safetensors, expected BF16 [192, 64]");
  EXPECT_CONTAINS(m, "\n  model.language_model.layers.3.mlp.down_proj.weight: BF16 [64, 128] in");
  EXPECT_CONTAINS(m, "\n  model.language_model.layers.4.mlp.up_proj.weight: missing (expected BF16 [192, 64])");
  EXPECT_CONTAINS(m, "\n  model.language_model.layers.4.input_layernorm.weight: missing (expected BF16 [64])");
  size_t lines = std::count(m.begin(), m.end(), '\n');
  EXPECT_EQ(lines, 23u);
}

TEST(Bind, UnexpectedTensorsAreWarningsAndWrongDtypesErrors) {
  std::string dir = test::copy_of(test::shared_preset("tiny"), "bind_unexpected");
  const std::string norm = "model.language_model.norm.weight";
  test::edit_header(test::shard_of(dir, norm), [&](nlohmann::json& h) {
    h["model.extra_buffer"] = {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {0, 0}}};
  });
  BindReport report;
  auto w = bind_dir(dir, &report);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ(report.unexpected, (std::vector<std::string>{"model.extra_buffer"}));

  test::edit_header(test::shard_of(dir, norm), [&](nlohmann::json& h) { h[norm]["dtype"] = "F16"; });
  w = bind_dir(dir, &report);
  ASSERT_FALSE(w.is_ok());
  EXPECT_CONTAINS(w.status().message(), norm + ": F16 [64] in " + test::shard_of(dir, norm) + ", expected BF16 [64]");
}

}  // namespace
}  // namespace qvl
