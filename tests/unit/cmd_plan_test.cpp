// `qvl plan` through the binary: sizes as people type them, the JSON fields, exit codes, a model
// directory that holds only config.json, auto-fit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/config.h"
#include "memory/byte_size.h"
#include "memory/planner.h"
#include "model/presets.h"
#include "support/test_support.h"

namespace qvl {
namespace {

test::CommandResult qvl_plan(const std::string& args) {
  return test::run_command(test::qvl_binary() + " plan " + args);
}

nlohmann::json json_of(const test::CommandResult& r) {
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << r.out << r.err;
  return j;
}

TEST(CmdPlan, FourBFp8OnSevenGiBAsJson) {
  auto r = qvl_plan("--preset 4b --fp8 --gpu-memory 7GiB --max-image-pixels 1048576 --context 4096 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = json_of(r);
  EXPECT_EQ(j["weights_bytes"].get<int64_t>(), weight_bytes(preset_config("4b", true).value()).total());
  EXPECT_EQ(j["weights_bytes"].get<int64_t>(), 5243844864);
  EXPECT_EQ(j["kv_bytes_per_token"].get<int64_t>(), 147456);
  EXPECT_EQ(j["budget_bytes"].get<int64_t>(), 7 * kGiB);
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_EQ(j["shortfall_bytes"].get<int64_t>(), 0);
  EXPECT_TRUE(j["suggestions"].is_array());
  EXPECT_TRUE(j["suggestions"].empty());
  EXPECT_EQ(j["image_tokens"].get<int64_t>(), 1024);
  const int64_t peak = j["peak_bytes"].get<int64_t>(), margin = j["margin_bytes"].get<int64_t>();
  EXPECT_LE(peak + margin, 7 * kGiB);
  EXPECT_GT(j["kv_capacity_tokens"].get<int64_t>(), 4096);
}

TEST(CmdPlan, SizesAsPeopleTypeThem) {
  for (auto [text, bytes] : {std::pair<const char*, int64_t>{"7.5G", 8053063680LL},
                             {"8000MiB", 8000 * kMiB},
                             {"8589934592", 8589934592LL},
                             {"'8 GiB'", 8 * kGiB}}) {
    auto r = qvl_plan(std::string("--preset 2b --json --gpu-memory ") + text);
    ASSERT_EQ(r.exit_code, 0) << text << ": " << r.err;
    EXPECT_EQ(json_of(r)["budget_bytes"].get<int64_t>(), bytes) << text;
  }
}

TEST(CmdPlan, BadSizeNamesTheText) {
  auto r = qvl_plan("--preset 2b --gpu-memory eight");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--gpu-memory: size 'eight'"), std::string::npos) << r.err;
}

TEST(CmdPlan, EightBBf16IsRefusedWithSuggestions) {
  auto r = qvl_plan("--preset 8b --gpu-memory 8GiB");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.out.find("DOES NOT FIT: short by"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--fp8"), std::string::npos);
  EXPECT_NE(r.out.find("--kv-dtype fp8"), std::string::npos);

  r = qvl_plan("--preset 8b --gpu-memory 8GiB --json");
  EXPECT_EQ(r.exit_code, 2);
  nlohmann::json j = json_of(r);
  EXPECT_FALSE(j["fits"].get<bool>());
  EXPECT_EQ(j["shortfall_bytes"].get<int64_t>(),
            j["peak_bytes"].get<int64_t>() + j["margin_bytes"].get<int64_t>() - 8 * kGiB);
  ASSERT_FALSE(j["suggestions"].empty());
  EXPECT_EQ(j["suggestions"][0]["flag"], "--fp8");
}

TEST(CmdPlan, AutoFitRunsAndSaysWhatItChose) {
  // 8B FP8 on 10.5 GiB: FP8 KV, a shorter context, a smaller image cap (what `qvl serve` can do).
  auto r = qvl_plan("--preset 8b --fp8 --gpu-memory 10.5GiB --auto-fit");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("auto-fit: --kv-dtype fp8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FITS with"), std::string::npos) << r.out;

  r = qvl_plan("--preset 8b --fp8 --gpu-memory 10.5GiB --auto-fit --json");
  ASSERT_EQ(r.exit_code, 0);
  nlohmann::json j = json_of(r);
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_FALSE(j["auto_fit"]["applied"].empty());

  // 8B BF16 on 8 GiB needs layer offload: auto-fit chooses it (memory_fit_test checks how many).
  r = qvl_plan("--preset 8b --gpu-memory 8GiB --auto-fit");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("auto-fit: --offload-layers "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FITS with"), std::string::npos) << r.out;

  // Not even every layer offloaded fits 2 GiB: exit 2 and the remaining shortfall.
  r = qvl_plan("--preset 8b --gpu-memory 2GiB --auto-fit");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("does not fit even with every change applied"), std::string::npos) << r.err;
}

TEST(CmdPlan, Fp8KvHalvesTheBytesPerToken) {
  auto r = qvl_plan("--preset 2b --kv-dtype fp8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json_of(r)["kv_bytes_per_token"].get<int64_t>(), 114688 / 2);
  r = qvl_plan("--preset 2b --kv-dtype fp16");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("fp16"), std::string::npos) << r.err;
}

TEST(CmdPlan, ModelDirectoryWithOnlyConfigJson) {
  std::string dir = test::scratch_dir("plan_model");
  { std::ofstream(dir + "/config.json") << model_config_to_json(preset_config("2b").value()); }
  auto r = qvl_plan("--model " + dir + " --gpu-memory 8GiB --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json_of(r)["weights_bytes"].get<int64_t>(), 4255561728);
  EXPECT_EQ(json_of(r)["kv_bytes_per_token"].get<int64_t>(), 114688);

  r = qvl_plan("--model " + dir + "/missing");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("missing"), std::string::npos) << r.err;
}

TEST(CmdPlan, HubIdResolvesInTheHubCache) {
  // $HF_HOME/hub/models--org--name/refs/main -> snapshots/<hash>/config.json (the 4B, tied).
  std::string home = test::scratch_dir("plan_hub");
  std::string repo = home + "/hub/models--Qwen--Qwen3-VL-4B-Instruct";
  std::filesystem::create_directories(repo + "/refs");
  std::filesystem::create_directories(repo + "/snapshots/abc123");
  std::ofstream(repo + "/refs/main") << "abc123";
  std::ofstream(repo + "/snapshots/abc123/config.json") << model_config_to_json(preset_config("4b").value());
  auto r = test::run_command("HF_HOME=" + home + " " + test::qvl_binary() +
                             " plan --model Qwen/Qwen3-VL-4B-Instruct --gpu-memory 24GiB --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json_of(r)["weights_bytes"].get<int64_t>(), weight_bytes(preset_config("4b").value()).total());
}

TEST(CmdPlan, NeedsExactlyOneModel) {
  EXPECT_EQ(qvl_plan("--gpu-memory 8GiB").exit_code, 1);
  EXPECT_EQ(qvl_plan("--preset 2b --model x").exit_code, 1);
  auto r = qvl_plan("--preset 3b");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("3b"), std::string::npos) << r.err;
}

TEST(CmdPlan, NoBudgetStillPlans) {
  // This test machine has no GPU: without --gpu-memory the plan prints what is needed.
  auto r = qvl_plan("--preset 2b --arch sm_89");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("No budget"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sm_89"), std::string::npos) << r.out;
  EXPECT_EQ(qvl_plan("--preset 2b --arch turing").exit_code, 1);
}

}  // namespace
}  // namespace qvl
