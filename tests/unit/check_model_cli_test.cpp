// qvl check-model and qvl gen-model through the binary: a generated tiny checkpoint passes,
// and each way of breaking one (truncated shard, corrupted header length, tensor removed from
// a shard, wrong dtype, missing config.json) exits non-zero with a message naming the file and
// the tensor or field, never a crash.
#include <gtest/gtest.h>

#include <filesystem>

#include "model/presets.h"
#include "model/tensor_specs.h"
#include "unit/io_test_util.h"

namespace qvl {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "stderr: " << (haystack)

test::CommandResult qvl(const std::string& args) {
  return test::run_command(test::qvl_binary() + " " + args);
}

// A crash would show as a signal (exit_code -1) or the internal-error code 70.
void expect_clean_failure(const test::CommandResult& r) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
}

TEST(CheckModelCli, GeneratedTinyPasses) {
  std::string out = test::temp_dir("cli_tiny");
  auto g = qvl("gen-model --preset tiny --seed 5 --out " + out);
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_CONTAINS(g.out, "wrote " + out + ": preset tiny, seed 5, 115 tensors");
  auto r = qvl("check-model " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_CONTAINS(r.out, "tied to embed_tokens");
  EXPECT_CONTAINS(r.out, "OK");
  auto j = qvl("check-model --json " + out);
  ASSERT_EQ(j.exit_code, 0) << j.err;
  auto json = nlohmann::json::parse(j.out);
  int64_t params = 0;
  uint64_t bytes = 0;
  for (const auto& s : checkpoint_tensor_specs(*preset_config("tiny"))) params += s.numel(), bytes += s.nbytes();
  EXPECT_EQ(json["total"]["params"].get<int64_t>(), params);
  EXPECT_EQ(json["total"]["bytes"].get<uint64_t>(), bytes);
  EXPECT_EQ(json["parts"]["embeddings"]["params"].get<int64_t>(), 151936 * 64);
  EXPECT_TRUE(json["tied"].get<bool>());
  EXPECT_EQ(json["shards"].get<int>(), 3);
}

TEST(CheckModelCli, Fp8AndUntiedSummaries) {
  std::string out = test::temp_dir("cli_tiny_fp8");
  ASSERT_EQ(qvl("gen-model --preset tiny-fp8 --out " + out).exit_code, 0);
  auto j = qvl("check-model --json " + out);
  ASSERT_EQ(j.exit_code, 0) << j.err;
  auto json = nlohmann::json::parse(j.out);
  EXPECT_TRUE(json["fp8"].get<bool>());
  EXPECT_EQ(json["fp8_linears"].get<int>(), 2 * 7);  // q k v o gate up down in 2 layers
  EXPECT_EQ(json["dtypes"]["F8_E4M3"]["tensors"].get<int>(), 14);

  std::string un = test::temp_dir("cli_untied");
  ASSERT_EQ(qvl("gen-model --preset tiny-untied --out " + un + " --max-shard-size 1GB").exit_code, 0);
  EXPECT_TRUE(fs::exists(un + "/model.safetensors"));
  auto u = qvl("check-model --json " + un);
  ASSERT_EQ(u.exit_code, 0) << u.err;
  json = nlohmann::json::parse(u.out);
  EXPECT_FALSE(json["tied"].get<bool>());
  EXPECT_EQ(json["parts"]["lm_head"]["params"].get<int64_t>(), 151936 * 96);
}

TEST(CheckModelCli, BuiltinNameResolvesThroughTheCache) {
  std::string cache = test::temp_dir("cli_cache");
  auto r = test::run_command("XDG_CACHE_HOME=" + cache + " " + test::qvl_binary() + " check-model tiny-fp8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_CONTAINS(r.out, cache + "/qvl/builtin/tiny-fp8-v1");
}

TEST(CheckModelCli, SameSeedSameBytes) {
  std::string a = test::temp_dir("cli_det_a"), b = test::temp_dir("cli_det_b"), c = test::temp_dir("cli_det_c");
  ASSERT_EQ(qvl("gen-model --preset tiny-fp8 --seed 11 --threads 1 --out " + a).exit_code, 0);
  ASSERT_EQ(qvl("gen-model --preset tiny-fp8 --seed 11 --threads 2 --out " + b).exit_code, 0);
  ASSERT_EQ(qvl("gen-model --preset tiny-fp8 --seed 12 --out " + c).exit_code, 0);
  for (const auto& e : fs::directory_iterator(a)) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(test::slurp(a + "/" + name) == test::slurp(b + "/" + name)) << name;
    if (name.find("-of-") != std::string::npos) {
      EXPECT_FALSE(test::slurp(a + "/" + name) == test::slurp(c + "/" + name)) << name;
    }
  }
}

class BrokenCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::copy_of(test::shared_preset("tiny"), "cli_broken"); }
  std::string dir_;
};

TEST_F(BrokenCheckpoint, TruncatedShard) {
  // Shard 2 holds only embed_tokens (19 MB); cut it in half.
  const std::string shard = dir_ + "/model-00002-of-00003.safetensors";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  auto r = qvl("check-model " + dir_);
  expect_clean_failure(r);
  EXPECT_CONTAINS(r.err, shard + ": tensor 'model.language_model.embed_tokens.weight': data_offsets");
  EXPECT_CONTAINS(r.err, "(file truncated?)");
}

TEST_F(BrokenCheckpoint, CorruptedHeaderLength) {
  const std::string shard = dir_ + "/model-00001-of-00003.safetensors";
  std::string bytes = test::slurp(shard);
  bytes[5] = '\x7f';  // length field now ~2^46
  test::spit(shard, bytes);
  auto r = qvl("check-model " + dir_);
  expect_clean_failure(r);
  EXPECT_CONTAINS(r.err, shard + ": header length");
  EXPECT_CONTAINS(r.err, "exceeds the 104857600-byte limit");
}

TEST_F(BrokenCheckpoint, TensorRemovedFromShard) {
  const std::string name = "model.language_model.norm.weight";
  const std::string shard = test::shard_of(dir_, name);
  test::edit_header(shard, [&](nlohmann::json& h) { h.erase(name); });
  auto r = qvl("check-model " + dir_);
  expect_clean_failure(r);
  EXPECT_CONTAINS(r.err, shard + ": tensor '" + name + "' is mapped to this shard by model.safetensors.index.json");

  // Removed from the index as well: binding reports it missing.
  auto index = nlohmann::json::parse(test::slurp(dir_ + "/model.safetensors.index.json"));
  index["weight_map"].erase(name);
  test::spit(dir_ + "/model.safetensors.index.json", index.dump());
  r = qvl("check-model " + dir_);
  expect_clean_failure(r);
  EXPECT_CONTAINS(r.err, name + ": missing (expected BF16 [64])");
}

TEST_F(BrokenCheckpoint, WrongDtype) {
  const std::string name = "model.visual.blocks.1.attn.qkv.weight";
  const std::string shard = test::shard_of(dir_, name);
  test::edit_header(shard, [&](nlohmann::json& h) { h[name]["dtype"] = "F16"; });
  auto r = qvl("check-model " + dir_);
  expect_clean_failure(r);
  EXPECT_CONTAINS(r.err, name + ": F16 [192, 64] in " + shard + ", expected BF16 [192, 64] or F8_E4M3 [192, 64]");
}

TEST_F(BrokenCheckpoint, MissingConfig) {
  fs::remove(dir_ + "/config.json");
  auto r = qvl("check-model " + dir_);
  expect_clean_failure(r);
  EXPECT_CONTAINS(r.err, dir_ + "/config.json not found");
}

TEST_F(BrokenCheckpoint, BadConfigField) {
  auto cfg = nlohmann::json::parse(test::slurp(dir_ + "/config.json"));
  cfg["text_config"]["hidden_act"] = "relu";
  test::spit(dir_ + "/config.json", cfg.dump());
  auto r = qvl("check-model " + dir_);
  expect_clean_failure(r);
  EXPECT_CONTAINS(r.err, dir_ + "/config.json: text_config.hidden_act = \"relu\"");
}

TEST(GenModelCli, RejectsBadArguments) {
  auto r = qvl("gen-model --preset 3b --out " + test::temp_dir("cli_bad"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_CONTAINS(r.err, "unknown preset '3b'");
  r = qvl("gen-model --preset tiny --max-shard-size lots --out " + test::temp_dir("cli_bad2"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_CONTAINS(r.err, "--max-shard-size 'lots'");
}

}  // namespace
}  // namespace qvl
