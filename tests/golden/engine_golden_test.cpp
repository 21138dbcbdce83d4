// The engine against transformers 5.17: for each tiny preset, the five reference cases (text
// only, one image, two images, image mid-text, multi-turn; tests/fixtures/model/, written by
// tools/reference/model_fixtures.py) are submitted together to one engine on the CPU backend —
// continuous batching, prompts prefilled in 16-row chunks beside other sequences' decodes, images
// encoded one at a time, a KV pool too small for all five to finish without preemption — and
// each must produce the reference's 32 greedy tokens exactly. model_golden_test.cpp checks the
// same tokens through the single-sequence SequenceRunner; this checks that scheduling, paging
// and sampling change none of them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/factory.h"
#include "engine/qwen3vl_runner.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "model/bind.h"
#include "model/load.h"
#include "model/model.h"
#include "support/test_support.h"
#include "unit/engine_fakes.h"

namespace qvl {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

const std::string kFixtureDir = test::fixture_path("model");

using test::read_json;

struct Case {
  std::string name;
  GenerationRequest request;
  std::vector<int32_t> want;
};

class EngineGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineGolden, BusyBatchGivesTheReferenceGreedyTokens) {
  const std::string preset = GetParam();
  if (!std::filesystem::exists(kFixtureDir + "/MANIFEST"))
    GTEST_SKIP() << "missing fixture " << kFixtureDir << "/MANIFEST (tools/reference/model_fixtures.py)";
  const json manifest = read_json(kFixtureDir + "/MANIFEST");
  if (!manifest["presets"].contains(preset)) GTEST_SKIP() << "the fixture has no preset " << preset;
  const json& entry = manifest["presets"][preset];

  // The checkpoint the fixtures were made from, regenerated and checked by hash.
  const std::string dir = test::scratch_dir("engine_golden_" + preset);
  const std::string cmd = test::qvl_binary() + " gen-model --preset " + preset + " --seed " +
                          std::to_string(entry["seed"].get<int64_t>()) + " --out " + dir;
  test::CommandResult gen = test::run_command(cmd);
  ASSERT_EQ(gen.exit_code, 0) << cmd << "\n" << gen.err;
  for (const auto& [file, hash] : entry["sha256"].items()) {
    test::CommandResult sum = test::run_command("sha256sum " + dir + "/" + file);
    ASSERT_EQ(sum.out.substr(0, 64), hash.get<std::string>()) << preset << ": " << file;
  }
  ModelConfig config = load_model_config(dir).value();
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  auto host = bind_host_weights(*ckpt, config);
  ASSERT_TRUE(host.is_ok()) << host.status().to_string();
  std::shared_ptr<Backend> backend = make_cpu_backend(0);
  auto weights = load_weights(*backend, *host);
  ASSERT_TRUE(weights.is_ok()) << weights.status().to_string();
  std::shared_ptr<const Qwen3VLModel> model =
      Qwen3VLModel::create(*backend, config, std::move(weights).value()).value();
  std::filesystem::remove_all(dir);  // the maps stay valid

  // The cases as requests: 32 greedy tokens each, eos ignored (the reference ran 32 steps).
  std::vector<Case> cases;
  int64_t max_patches = 0, total_tokens = 0;
  for (const auto& c : manifest["cases"]) {
    const json meta = read_json(kFixtureDir + "/" + preset + "/" + c.get<std::string>() + "/meta.json");
    Case k;
    k.name = c.get<std::string>();
    k.request.prompt_ids = meta["input_ids"].get<std::vector<int32_t>>();
    for (size_t i = 0; i < meta["images"].size(); ++i) {
      PreparedImage img;
      img.pixel_values = test::read_f32(kFixtureDir + "/images/" + meta["images"][i].get<std::string>() + ".f32");
      const auto g = meta["image_grid_thw"][i].get<std::vector<int>>();
      img.grid_t = g[0];
      img.grid_h = g[1];
      img.grid_w = g[2];
      max_patches = std::max(max_patches, img.num_patches());
      k.request.images.push_back(std::move(img));
    }
    for (int64_t t : meta["greedy_tokens"].get<std::vector<int64_t>>()) k.want.push_back(static_cast<int32_t>(t));
    k.request.sampling.temperature = 0;
    k.request.sampling.max_tokens = static_cast<int>(k.want.size());
    k.request.sampling.ignore_eos = true;
    total_tokens += static_cast<int64_t>(k.request.prompt_ids.size()) + k.request.sampling.max_tokens;
    cases.push_back(std::move(k));
  }
  ASSERT_EQ(cases.size(), 5u);

  // 4 running at once, 16-row steps, a pool of 4-token pages holding about 60% of what all five
  // need at their ends (so the youngest are preempted and recomputed).
  EngineOptions eo;
  eo.max_running = 4;
  eo.max_step_tokens = 16;
  eo.max_context = 256;
  eo.eos_token_ids = {151645, 151643};
  Qwen3VLRunnerOptions ro;
  ro.limits = runner_limits(eo, 4, max_patches);
  ro.kv_dtype = DType::kF32;
  auto runner = make_qwen3vl_runner(backend, model, ro);
  ASSERT_TRUE(runner.is_ok()) << runner.status().to_string();
  const KvLayout layout = (*runner)->info().kv_layout;
  int64_t longest = 0;
  for (const auto& k : cases)
    longest = std::max<int64_t>(longest, k.request.prompt_ids.size() + k.request.sampling.max_tokens);
  const int64_t pages = std::max<int64_t>((longest + 3) / 4 + 1, total_tokens * 6 / 10 / 4);
  auto pool = KvPagePool::create(make_host_region(layout.token_bytes() * 4 * pages).value(), layout, {4, pages, 8, 0});
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  auto engine = make_engine(std::move(runner).value(), std::move(pool).value(), test::fake_text_streams(), eo);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();

  std::vector<std::unique_ptr<RequestStream>> streams;
  for (const auto& k : cases) {
    auto s = (*engine)->submit(k.request);
    ASSERT_TRUE(s.is_ok()) << k.name << ": " << s.status().to_string();
    streams.push_back(std::move(s).value());
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<int32_t> got;
    bool finished = false;
    for (int n = 0; n < 6000 && !finished; ++n) {
      auto ev = streams[i]->next(50ms);
      if (!ev) continue;
      got.insert(got.end(), ev->token_ids.begin(), ev->token_ids.end());
      if (ev->kind == GenerationEvent::Kind::kFinished) {
        finished = true;
        EXPECT_EQ(ev->finish_reason, FinishReason::kLength) << cases[i].name << ": " << ev->error.to_string();
      }
    }
    ASSERT_TRUE(finished) << cases[i].name << " did not finish";
    EXPECT_EQ(got, cases[i].want) << preset << "/" << cases[i].name;
  }
  EXPECT_EQ((*engine)->stats().kv_pages_used, 0);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, EngineGolden, ::testing::Values("tiny", "tiny-untied", "tiny-fp8"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace qvl
