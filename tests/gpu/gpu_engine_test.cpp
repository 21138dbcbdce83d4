// The engine on the CUDA backend with the `tiny` preset (the checkpoint the model fixtures were
// made from, regenerated and checked by hash), on what only a GPU exercises: BF16 logits brought
// back for the sampler, decode steps through recorded graphs, a KV region that grows in place.
//   - decode graphs on and off give bit-identical tokens (same requests, same shapes), with a
//     BF16 and with an FP8 E4M3 KV cache;
//   - device greedy (the argmax taken on the GPU, recorded with the decode graph, only the ids
//     brought back) gives the host sampler's tokens, with graphs and without;
//   - a KV pool that grows by two pages at a time mid-generation gives the same tokens as one
//     committed up front (growth keeps the base; recordings restart with the new page count);
//   - the five reference cases run together in a busy batch (chunked prefill, preemption,
//     graphs) all finish, and each follows transformers' float32 greedy tokens up to the first
//     step whose reference top-1/top-2 margin is under tol::kBf16GreedyMargin (BF16 activations
//     may legitimately flip a closer call); so do three copies of each at once (decode steps of
//     up to 15 rows: cuBLASLt Linears in the decode graphs).
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_backend.h"
#include "engine/factory.h"
#include "engine/qwen3vl_runner.h"
#include "gpu/gpu_util.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "model/bind.h"
#include "model/load.h"
#include "model/model.h"
#include "support/test_support.h"
#include "unit/engine_fakes.h"

namespace qvl::test::gpu {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

const std::string kFixtureDir = test::fixture_path("model");

struct Case {
  std::string name;
  GenerationRequest request;
  std::vector<int32_t> want;
  std::vector<double> margins;
};

struct Tiny {
  std::shared_ptr<Backend> backend;  // not owning: gpu_util's CUDA backend
  std::shared_ptr<const Qwen3VLModel> model;
  std::vector<Case> cases;
  int64_t max_patches = 0;
};

// Loads the tiny preset on CUDA and the five reference cases; false (with the reason) when the
// fixture is missing.
bool load_tiny(Tiny* t, std::string* why) {
  if (!std::filesystem::exists(kFixtureDir + "/MANIFEST")) {
    *why = "missing fixture " + kFixtureDir + "/MANIFEST (tools/reference/model_fixtures.py)";
    return false;
  }
  const json manifest = read_json(kFixtureDir + "/MANIFEST");
  const json& entry = manifest["presets"]["tiny"];
  const std::string dir = test::scratch_dir("gpu_engine_tiny");
  const std::string cmd = test::qvl_binary() + " gen-model --preset tiny --seed " +
                          std::to_string(entry["seed"].get<int64_t>()) + " --out " + dir;
  test::CommandResult gen = test::run_command(cmd);
  EXPECT_EQ(gen.exit_code, 0) << cmd << "\n" << gen.err;
  for (const auto& [file, hash] : entry["sha256"].items()) {
    test::CommandResult sum = test::run_command("sha256sum " + dir + "/" + file);
    EXPECT_EQ(sum.out.substr(0, 64), hash.get<std::string>()) << "tiny: " << file;
  }
  ModelConfig config = load_model_config(dir).value();
  auto ckpt = Checkpoint::open(dir);
  EXPECT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  auto host = bind_host_weights(*ckpt, config);
  EXPECT_TRUE(host.is_ok()) << host.status().to_string();
  t->backend = std::shared_ptr<Backend>(cuda(), [](Backend*) {});
  auto weights = load_weights(*t->backend, *host);
  EXPECT_TRUE(weights.is_ok()) << weights.status().to_string();
  t->model = Qwen3VLModel::create(*t->backend, config, std::move(weights).value()).value();
  std::filesystem::remove_all(dir);
  for (const auto& c : manifest["cases"]) {
    const json meta = read_json(kFixtureDir + "/tiny/" + c.get<std::string>() + "/meta.json");
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
      t->max_patches = std::max(t->max_patches, img.num_patches());
      k.request.images.push_back(std::move(img));
    }
    for (int64_t tok : meta["greedy_tokens"].get<std::vector<int64_t>>()) k.want.push_back(static_cast<int32_t>(tok));
    k.margins = meta["greedy_margins"].get<std::vector<double>>();
    k.request.sampling.temperature = 0;
    k.request.sampling.max_tokens = static_cast<int>(k.want.size());
    k.request.sampling.ignore_eos = true;
    t->cases.push_back(std::move(k));
  }
  return !::testing::Test::HasFailure();
}

Tiny& tiny(std::string* why) {
  static Tiny t;
  static bool ok = false, tried = false;
  static std::string reason;
  if (!tried) {
    tried = true;
    ok = load_tiny(&t, &reason);
  }
  *why = ok ? "" : (reason.empty() ? "loading the tiny preset failed" : reason);
  return t;
}

struct EngineShape {
  int max_running = 4;
  int step_tokens = 16;
  int64_t pool_pages = 256;
  int64_t grow_pages = 256;
  bool graphs = true;
  DType kv_dtype = DType::kBF16;
  bool device_greedy = true;
  bool device_top_k = true;
};

std::unique_ptr<Engine> make_cuda_engine(Tiny& t, const EngineShape& shape) {
  EngineOptions eo;
  eo.max_running = shape.max_running;
  eo.max_step_tokens = shape.step_tokens;
  eo.max_context = 256;
  eo.eos_token_ids = {151645, 151643};
  eo.device_greedy = shape.device_greedy;
  eo.device_top_k = shape.device_top_k;
  Qwen3VLRunnerOptions ro;
  ro.limits = runner_limits(eo, 4, t.max_patches);
  ro.kv_dtype = shape.kv_dtype;
  ro.decode_graphs = shape.graphs;
  auto runner = make_qwen3vl_runner(t.backend, t.model, ro);
  EXPECT_TRUE(runner.is_ok()) << runner.status().to_string();
  const KvLayout layout = (*runner)->info().kv_layout;
  auto storage = make_kv_storage(*t.backend, layout.token_bytes() * 4 * shape.pool_pages);
  EXPECT_TRUE(storage.is_ok()) << storage.status().to_string();
  auto pool = KvPagePool::create(std::move(storage).value(), layout, {4, shape.pool_pages, shape.grow_pages, 0});
  EXPECT_TRUE(pool.is_ok()) << pool.status().to_string();
  auto engine = make_engine(std::move(runner).value(), std::move(pool).value(), test::fake_text_streams(), eo);
  EXPECT_TRUE(engine.is_ok()) << engine.status().to_string();
  return std::move(engine).value();
}

std::vector<std::vector<int32_t>> run_all(Engine& engine, const std::vector<GenerationRequest>& reqs) {
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (const auto& r : reqs) streams.push_back(std::move(engine.submit(r)).value());
  std::vector<std::vector<int32_t>> out;
  for (auto& s : streams) {
    std::vector<int32_t> ids;
    for (int n = 0; n < 6000; ++n) {
      auto ev = s->next(50ms);
      if (!ev) continue;
      ids.insert(ids.end(), ev->token_ids.begin(), ev->token_ids.end());
      if (ev->kind == GenerationEvent::Kind::kFinished) {
        EXPECT_EQ(ev->finish_reason, FinishReason::kLength) << ev->error.to_string();
        break;
      }
    }
    out.push_back(std::move(ids));
  }
  return out;
}

// Each case alone on `engine`, one after the other.
std::vector<std::vector<int32_t>> run_each(Engine& engine, const std::vector<Case>& cases) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& c : cases) out.push_back(run_all(engine, {c.request})[0]);
  return out;
}

// Every case alone on an engine of shape `a` and one of shape `b`: the same tokens, each case
// as many as its reference.
void expect_same_tokens(Tiny& t, const EngineShape& a, const EngineShape& b) {
  const auto ta = run_each(*make_cuda_engine(t, a), t.cases);
  const auto tb = run_each(*make_cuda_engine(t, b), t.cases);
  for (size_t i = 0; i < t.cases.size(); ++i) {
    EXPECT_EQ(ta[i].size(), t.cases[i].want.size()) << t.cases[i].name;
    EXPECT_EQ(tb[i], ta[i]) << t.cases[i].name;
  }
}

TEST(GpuEngine, DecodeGraphsOnAndOffGiveTheSameTokens) {
  QVL_REQUIRE_CUDA();
  std::string why;
  Tiny& t = tiny(&why);
  if (!why.empty()) GTEST_SKIP() << why;
  for (DType kv : {DType::kBF16, DType::kF8E4M3}) {
    SCOPED_TRACE(std::string("KV ") + std::string(dtype_name(kv)));
    EngineShape eager, graphs;
    eager.graphs = false;
    eager.kv_dtype = graphs.kv_dtype = kv;
    expect_same_tokens(t, eager, graphs);
  }
}

TEST(GpuEngine, DeviceGreedyGivesTheHostSamplersTokens) {
  QVL_REQUIRE_CUDA();
  std::string why;
  Tiny& t = tiny(&why);
  if (!why.empty()) GTEST_SKIP() << why;
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "decode graphs" : "eager");
    // Each case alone: the same shapes on both engines, so the logits are bit-identical and only
    // where the argmax is taken differs.
    EngineShape host, device;
    host.device_greedy = false;
    host.graphs = device.graphs = graphs;
    expect_same_tokens(t, host, device);
  }
}

TEST(GpuEngine, CandidateSamplingGivesTheHostSamplersTokens) {
  QVL_REQUIRE_CUDA();
  std::string why;
  Tiny& t = tiny(&why);
  if (!why.empty()) GTEST_SKIP() << why;
  // The cases sampled as Qwen3-VL's generation_config does (and one with a repetition penalty),
  // each alone on both engines: the same logits, sampled from the whole rows on the host or
  // from the keys of Backend::top_k_rows.
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < t.cases.size(); ++i) {
    GenerationRequest r = t.cases[i].request;
    r.sampling.temperature = 0.7f;
    r.sampling.top_k = 20;
    r.sampling.top_p = 0.8f;
    r.sampling.seed = 100 + i;
    if (i % 2 == 1) r.sampling.repetition_penalty = 1.3f;
    reqs.push_back(std::move(r));
  }
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "decode graphs" : "eager");
    EngineShape host, device;
    host.device_greedy = false;
    host.device_top_k = false;
    host.graphs = device.graphs = graphs;
    auto host_engine = make_cuda_engine(t, host), device_engine = make_cuda_engine(t, device);
    for (size_t i = 0; i < reqs.size(); ++i) {
      const auto want = run_all(*host_engine, {reqs[i]})[0];
      EXPECT_EQ(want.size(), static_cast<size_t>(reqs[i].sampling.max_tokens)) << t.cases[i].name;
      EXPECT_EQ(run_all(*device_engine, {reqs[i]})[0], want) << t.cases[i].name;
    }
  }
}

TEST(GpuEngine, AGrowingKvRegionGivesTheSameTokens) {
  QVL_REQUIRE_CUDA();
  std::string why;
  Tiny& t = tiny(&why);
  if (!why.empty()) GTEST_SKIP() << why;
  EngineShape fixed, growing;
  growing.grow_pages = 2;  // 8 tokens at a time: the region grows many times per request
  expect_same_tokens(t, fixed, growing);
}

TEST(GpuEngine, BusyBatchFollowsTheReferenceTokens) {
  QVL_REQUIRE_CUDA();
  std::string why;
  Tiny& t = tiny(&why);
  if (!why.empty()) GTEST_SKIP() << why;
  int64_t total = 0;
  std::vector<GenerationRequest> reqs;
  for (const auto& c : t.cases) {
    total += static_cast<int64_t>(c.request.prompt_ids.size()) + c.request.sampling.max_tokens;
    reqs.push_back(c.request);
  }
  EngineShape busy;
  busy.pool_pages = std::max<int64_t>(total * 6 / 10 / 4, 80);  // too small for all five: preemption
  busy.grow_pages = 8;
  auto got = run_all(*make_cuda_engine(t, busy), reqs);
  for (size_t i = 0; i < t.cases.size(); ++i) {
    const Case& c = t.cases[i];
    ASSERT_EQ(got[i].size(), c.want.size()) << c.name;
    for (size_t s = 0; s < c.want.size() && c.margins[s] >= tol::kBf16GreedyMargin; ++s)
      ASSERT_EQ(got[i][s], c.want[s]) << c.name << " step " << s << " (reference margin " << c.margins[s] << ")";
  }
}

// Three copies of each reference case at once: decode steps of up to 15 rows, whose BF16 Linears
// are cuBLASLt GEMMs (over kSkinnyBf16MaxRows) recorded in the decode graphs. Every copy follows
// transformers' float32 greedy tokens up to the first close call, as in the busy batch.
TEST(GpuEngine, AWideBatchFollowsTheReferenceTokens) {
  QVL_REQUIRE_CUDA();
  std::string why;
  Tiny& t = tiny(&why);
  if (!why.empty()) GTEST_SKIP() << why;
  constexpr int kCopies = 3;
  int64_t total = 0;
  std::vector<GenerationRequest> reqs;
  for (int copy = 0; copy < kCopies; ++copy)
    for (const auto& c : t.cases) {
      total += static_cast<int64_t>(c.request.prompt_ids.size()) + c.request.sampling.max_tokens;
      reqs.push_back(c.request);
    }
  ASSERT_GT(static_cast<int>(reqs.size()), kSkinnyBf16MaxRows);
  EngineShape wide;
  wide.max_running = static_cast<int>(reqs.size());
  wide.step_tokens = 256;
  wide.pool_pages = total / 4 + 64;  // every sequence fits: no preemption
  wide.grow_pages = wide.pool_pages;
  auto got = run_all(*make_cuda_engine(t, wide), reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Case& c = t.cases[i % t.cases.size()];
    ASSERT_EQ(got[i].size(), c.want.size()) << c.name << " copy " << i / t.cases.size();
    for (size_t s = 0; s < c.want.size() && c.margins[s] >= tol::kBf16GreedyMargin; ++s)
      ASSERT_EQ(got[i][s], c.want[s]) << c.name << " copy " << i / t.cases.size() << " step " << s
                                      << " (reference margin " << c.margins[s] << ")";
  }
}

}  // namespace
}  // namespace qvl::test::gpu
