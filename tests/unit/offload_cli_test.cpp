// The memory flags of `qvl run` / `qvl plan` through the binary: --offload-layers gives the same
// greedy tokens as a resident model (the CPU backend streams too), out-of-range values fail with
// the layer count, --auto-fit without a budget (the CPU) changes nothing, --fp8 quantizes a BF16
// checkpoint at load, and `qvl plan --offload-layers` reports the staging buffers and page tables
// the planner computes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "memory/planner.h"
#include "model/presets.h"
#include "support/test_support.h"

namespace qvl {
namespace {

class RunFlags : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::tokenizer_dir().empty()) GTEST_SKIP() << "no tokenizer (scripts/fetch_npm.sh)";
    env_ = "XDG_CACHE_HOME=" + test::scratch_dir("offload_cli_cache") + " QVL_TOKENIZER_DIR=" + test::tokenizer_dir() +
           " ";
  }
  test::CommandResult run(const std::string& args) {
    return test::run_command(env_ + test::qvl_binary() + " run tiny --backend cpu --threads 2 --image " +
                             std::string(QVL_SOURCE_DIR) + "/assets/example.jpg --task caption --max-tokens 8 " +
                             "--ignore-eos --temperature 0 --json " + args);
  }
  static std::vector<int> tokens(const test::CommandResult& r) {
    nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.out << r.err;
    return j.is_discarded() ? std::vector<int>{} : j["token_ids"].get<std::vector<int>>();
  }
  std::string env_;
};

TEST_F(RunFlags, OffloadedLayersGiveTheSameTokens) {
  auto resident = run("");
  ASSERT_EQ(resident.exit_code, 0) << resident.err;
  const std::vector<int> want = tokens(resident);
  ASSERT_EQ(want.size(), 8u);
  for (int n : {1, 2, 4}) {
    auto r = run("--offload-layers " + std::to_string(n));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(tokens(r), want) << n << " layers offloaded";
    EXPECT_NE(r.err.find("offload: " + std::to_string(n) + " of 4 decoder layers in host memory"), std::string::npos)
        << r.err;
  }
}

TEST_F(RunFlags, OutOfRangeOffloadFailsWithTheLayerCount) {
  auto r = run("--offload-layers 5");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--offload-layers 5: the model has 4 decoder layers"), std::string::npos) << r.err;
  r = run("--offload-layers -1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--offload-layers -1 must be >= 0"), std::string::npos) << r.err;
}

TEST_F(RunFlags, AutoFitWithoutABudgetChangesNothing) {
  auto a = run(""), b = run("--auto-fit");
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(b.err.find("auto-fit:"), std::string::npos) << b.err;
  EXPECT_EQ(tokens(b), tokens(a));
}

TEST_F(RunFlags, Fp8QuantizesTheBf16CheckpointAtLoad) {
  auto r = run("--fp8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // tiny: 4 layers x (q, k, v, o, gate, up, down).
  EXPECT_NE(r.err.find("FP8 weights: 28 text Linears of the BF16 checkpoint quantized at load"), std::string::npos)
      << r.err;
  EXPECT_EQ(tokens(r).size(), 8u);
}

TEST(PlanFlags, OffloadLayersAsJson) {
  const std::string flags = "--preset 4b --arch sm_90 --gpu-memory 6GiB --max-image-pixels 1048576";
  RuntimeOptions o;
  o.gpu_memory_bytes = 6 * kGiB;
  o.max_image_pixels = 1048576;
  DeviceFacts sm90;
  sm90.compute_capability = 90;
  const ModelConfig c = preset_config("4b").value();
  // The fewest offloaded layers that fit, found with plan() in this process.
  int fewest = -1;
  for (int n = 0; n <= 36 && fewest < 0; ++n) {
    o.offload_layers = n;
    if (plan(c, o, sm90)->fits) fewest = n;
  }
  ASSERT_GT(fewest, 2);
  o.offload_layers = fewest;
  const MemoryPlan want = plan(c, o, sm90).value();
  auto r = test::run_command(test::qvl_binary() + " plan " + flags + " --offload-layers " + std::to_string(fewest) +
                             " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_EQ(j["offload_layers"].get<int>(), fewest);
  EXPECT_EQ(j["peak_bytes"].get<int64_t>(), want.peak_bytes);
  EXPECT_EQ(j["weights"]["offload_staging"].get<int64_t>(), want.offload_staging);
  EXPECT_EQ(j["weights"]["offload_page_tables"].get<int64_t>(), want.offload_page_tables);
  EXPECT_EQ(j["weights"]["offloaded"].get<int64_t>(), fewest * want.weights.largest_layer);
  // One layer fewer does not fit: exit 2.
  r = test::run_command(test::qvl_binary() + " plan " + flags + " --offload-layers " + std::to_string(fewest - 1));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("DOES NOT FIT"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace qvl
