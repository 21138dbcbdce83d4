// The engine on the real model: the `tiny` Qwen3-VL architecture with random weights on the CPU
// backend, driven through the Qwen3VLModel runner, the paged KV pool and the scheduler.
//   - greedy tokens equal the model engineer's SequenceRunner (one sequence, identity pages, no
//     batching) for a prompt with two images;
//   - the same requests give the same tokens alone and inside a busy batch (small steps so that
//     prompts are chunked beside decodes, a small pool so that sequences are preempted and
//     recomputed, images encoded one at a time);
//   - the same seed gives the same sampled tokens;
//   - device greedy (ModelRunner::forward_greedy: the argmax taken by the backend, only the ids
//     brought back) equals the host argmax of forward()'s logits on every step of a busy run, and
//     an engine with it on gives the same tokens as with it off, beside sampled and penalised
//     requests (which keep the host sampler).
// The CPU backend computes every row independently of its batch (model_chunked_test.cpp), so
// tokens must match exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "engine/factory.h"
#include "engine/qwen3vl_runner.h"
#include "image/image.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/runner.h"
#include "random_model.h"
#include "unit/engine_fakes.h"

namespace qvl {
namespace {

using namespace std::chrono_literals;

struct TinyModel {
  ModelConfig cfg = preset_config("tiny").value();
  std::shared_ptr<Backend> backend{make_cpu_backend(2)};
  test::RandomModel weights{cfg, *backend, 11};
  std::shared_ptr<const Qwen3VLModel> model{Qwen3VLModel::create(*backend, cfg, weights.weights).value()};
};

TinyModel& tiny() {
  static TinyModel* m = new TinyModel();  // shared by the tests (building it costs ~1 s)
  return *m;
}

using WrapRunner = std::function<std::unique_ptr<ModelRunner>(std::unique_ptr<ModelRunner>)>;

std::unique_ptr<Engine> make_tiny_engine(int max_running, int step_tokens, int64_t pool_pages, int page_size = 4,
                                         bool decode_graphs = false, bool device_greedy = true,
                                         const WrapRunner& wrap = {}, bool device_top_k = true) {
  TinyModel& t = tiny();
  EngineOptions eo;
  eo.max_running = max_running;
  eo.max_step_tokens = step_tokens;
  eo.max_context = 256;
  eo.eos_token_ids = {151645, 151643};
  eo.device_greedy = device_greedy;
  eo.device_top_k = device_top_k;
  Qwen3VLRunnerOptions ro;
  ro.limits = runner_limits(eo, page_size, /*max_image_patches=*/64);
  ro.kv_dtype = DType::kF32;
  ro.decode_graphs = decode_graphs;
  auto made = make_qwen3vl_runner(t.backend, t.model, ro);
  EXPECT_TRUE(made.is_ok()) << made.status().to_string();
  std::unique_ptr<ModelRunner> runner = std::move(made).value();
  if (wrap) runner = wrap(std::move(runner));
  const KvLayout layout = runner->info().kv_layout;
  auto storage = make_host_region(layout.token_bytes() * page_size * pool_pages).value();
  auto pool = KvPagePool::create(std::move(storage), layout, {page_size, pool_pages, 4, 0});
  EXPECT_TRUE(pool.is_ok()) << pool.status().to_string();
  auto engine = make_engine(std::move(runner), std::move(pool).value(), test::fake_text_streams(), eo);
  EXPECT_TRUE(engine.is_ok()) << engine.status().to_string();
  return std::move(engine).value();
}

PreparedImage random_image(int h, int w, uint32_t seed) {
  PreparedImage img;
  img.grid_h = h;
  img.grid_w = w;
  img.pixel_values.resize(static_cast<size_t>(h) * w * tiny().cfg.vision.patch_dim());
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  for (float& v : img.pixel_values) v = d(gen);
  return img;
}

// A chat-shaped prompt with the given images (grid h×w each → h·w/4 pads) and some text.
GenerationRequest make_request(const std::vector<PreparedImage>& images, int text_salt, int max_tokens) {
  const int pad = tiny().cfg.tokens.image_token_id;
  GenerationRequest r;
  r.prompt_ids = {151644, 872, 198};
  for (const auto& img : images) {
    r.prompt_ids.push_back(151652);
    r.prompt_ids.insert(r.prompt_ids.end(), img.num_patches() / 4, pad);
    r.prompt_ids.push_back(151653);
  }
  for (int i = 0; i < 5 + text_salt % 7; ++i) r.prompt_ids.push_back(1000 + 37 * i + 101 * text_salt);
  r.prompt_ids.insert(r.prompt_ids.end(), {151645, 198, 151644, 77091, 198});
  r.images = images;
  r.sampling.temperature = 0;
  r.sampling.top_k = 0;
  r.sampling.top_p = 1;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

std::vector<int32_t> collect_ids(RequestStream& s) {
  std::vector<int32_t> ids;
  for (int i = 0; i < 2000; ++i) {
    auto ev = s.next(50ms);
    if (!ev) continue;
    ids.insert(ids.end(), ev->token_ids.begin(), ev->token_ids.end());
    if (ev->kind == GenerationEvent::Kind::kFinished) {
      EXPECT_NE(ev->finish_reason, FinishReason::kError) << ev->error.to_string();
      return ids;
    }
  }
  ADD_FAILURE() << "request did not finish";
  return ids;
}

std::vector<std::vector<int32_t>> run_all(Engine& engine, const std::vector<GenerationRequest>& reqs) {
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (const auto& r : reqs) {
    auto s = engine.submit(r);
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    streams.push_back(std::move(s).value());
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& s : streams) out.push_back(collect_ids(*s));
  return out;
}

// Greedy decoding with SequenceRunner, the model's own single-sequence driver.
std::vector<int32_t> sequence_runner_greedy(const GenerationRequest& r) {
  SequenceRunner::Options opt;
  opt.max_tokens = 256;
  opt.page_size = 16;
  auto runner = SequenceRunner::create(*tiny().model, opt).value();
  std::vector<ImageInput> inputs;
  for (const auto& img : r.images) inputs.push_back({img.pixel_values.data(), ImageGrid{1, img.grid_h, img.grid_w}});
  std::vector<float> logits = runner->prefill(r.prompt_ids, inputs, 1).value();
  std::vector<int32_t> out;
  while (static_cast<int>(out.size()) < r.sampling.max_tokens) {
    out.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    if (static_cast<int>(out.size()) < r.sampling.max_tokens) logits = runner->decode(out.back()).value();
  }
  return out;
}

TEST(EngineModel, GreedyTokensEqualTheSequenceRunner) {
  auto req = make_request({random_image(4, 6, 1), random_image(4, 4, 2)}, 3, 10);
  auto engine = make_tiny_engine(4, 16, 64);
  auto got = run_all(*engine, {req});
  EXPECT_EQ(got[0], sequence_runner_greedy(req));
}

// The same images as RGB bytes (what the server sends) and as their f32 pixel values give the
// same tokens; RGB bytes of the wrong size are a clear error for that request, not a crash.
TEST(EngineModel, RgbImagesGiveThePixelValuesTokens) {
  const VisionConfig& vc = tiny().cfg.vision;
  std::vector<PreparedImage> rgb_images, px_images;
  std::mt19937 gen(4);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto [h, w] : {std::pair{4, 6}, std::pair{2, 4}}) {
    PreparedImage rgb;
    rgb.grid_h = h;
    rgb.grid_w = w;
    rgb.rgb.resize(static_cast<size_t>(h * vc.patch_size) * w * vc.patch_size * 3);
    for (uint8_t& b : rgb.rgb) b = static_cast<uint8_t>(byte(gen));
    PreparedImage px = rgb;
    px.rgb.clear();
    px.pixel_values.resize(static_cast<size_t>(h) * w * vc.patch_dim());
    image::patchify_into(rgb.rgb.data(), h * vc.patch_size, w * vc.patch_size, vc.patch_size, vc.spatial_merge_size,
                         vc.temporal_patch_size, px.pixel_values.data());
    rgb_images.push_back(std::move(rgb));
    px_images.push_back(std::move(px));
  }
  auto engine = make_tiny_engine(2, 16, 64);
  const auto got = run_all(*engine, {make_request(rgb_images, 5, 8), make_request(px_images, 5, 8)});
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(got[0].size(), 8u);

  GenerationRequest bad = make_request(rgb_images, 5, 8);
  bad.images[1].rgb.pop_back();
  auto stream = engine->submit(bad);
  ASSERT_TRUE(stream.is_ok()) << stream.status().to_string();
  std::optional<GenerationEvent> last;
  for (int i = 0; i < 2000 && !(last && last->kind == GenerationEvent::Kind::kFinished); ++i) {
    auto ev = (*stream)->next(50ms);
    if (ev) last = std::move(ev);
  }
  ASSERT_TRUE(last && last->kind == GenerationEvent::Kind::kFinished);
  EXPECT_EQ(last->finish_reason, FinishReason::kError);
  const std::string says = "image rgb holds " + std::to_string(bad.images[1].rgb.size()) + " bytes";
  EXPECT_NE(last->error.message().find(says), std::string::npos) << last->error.to_string();
  // And the engine keeps serving.
  EXPECT_EQ(run_all(*engine, {make_request(px_images, 5, 8)})[0], got[1]);
}

TEST(EngineModel, SameTokensAloneAndInsideABusyBatch) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    std::vector<PreparedImage> images;
    if (i % 3 != 2) images.push_back(random_image(4, 2 + 2 * (i % 3), 10 + i));
    if (i % 2 == 0) images.push_back(random_image(2, 4, 20 + i));
    auto r = make_request(images, i, 8 + i);
    if (i % 2) {
      r.sampling.temperature = 0.8f;
      r.sampling.top_k = 40;
      r.sampling.seed = 100 + i;
    }
    reqs.push_back(r);
  }
  std::vector<std::vector<int32_t>> alone;
  {
    auto engine = make_tiny_engine(1, 64, 64);
    for (const auto& r : reqs) alone.push_back(run_all(*engine, {r})[0]);
  }
  // 4 at once in 7-row steps (prompts of 20-30 tokens are chunked beside decodes) and a pool of
  // 30 pages of 4 tokens that cannot hold four of them to the end (preemption).
  auto engine = make_tiny_engine(4, 7, 30);
  auto busy = run_all(*engine, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(busy[i], alone[i]) << "request " << i;
  EXPECT_EQ(engine->stats().kv_pages_used, 0);
}

TEST(EngineModel, DecodeGraphShapesGiveTheSameTokens) {
  // The graph path's bucketed shape (full-width page table, max_context rounded up) on the CPU
  // backend, where run_graph runs the ops directly: the numbers must not move.
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 3; ++i) reqs.push_back(make_request({random_image(2, 2 + 2 * i, 30 + i)}, i, 12));
  auto plain = make_tiny_engine(3, 32, 64);
  auto graphs = make_tiny_engine(3, 32, 64, 4, /*decode_graphs=*/true);
  EXPECT_EQ(run_all(*graphs, reqs), run_all(*plain, reqs));
}

TEST(EngineModel, SameSeedSameTokens) {
  auto r = make_request({random_image(2, 2, 5)}, 1, 12);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 42;
  auto r2 = r;
  r2.sampling.seed = 43;
  auto engine = make_tiny_engine(4, 32, 64);
  auto out = run_all(*engine, {r, r, r2});
  EXPECT_EQ(out[0], out[1]);
  EXPECT_NE(out[0], out[2]);
}

// What GreedyCheckRunner saw.
struct GreedyCheck {
  int steps = 0, rows = 0, steps_without_rows = 0, steps_with_several_rows = 0, mismatches = 0, nans = 0;
};

// Passes every call to the runner it wraps; the test runners below override what they observe.
class ForwardingRunner : public ModelRunner {
 public:
  explicit ForwardingRunner(std::unique_ptr<ModelRunner> inner) : inner_(std::move(inner)) {}
  const ModelInfo& info() const override { return inner_->info(); }
  std::vector<int32_t> prompt_positions(std::span<const int32_t> prompt_ids, const std::vector<PreparedImage>& images,
                                        int64_t* rope_delta) const override {
    return inner_->prompt_positions(prompt_ids, images, rope_delta);
  }
  Result<std::unique_ptr<ImageFeatures>> encode_image(const PreparedImage& image) override {
    return inner_->encode_image(image);
  }
  Status forward(const StepInput& step, const KvCacheView& cache, std::span<float> logits) override {
    return inner_->forward(step, cache, logits);
  }
  Status forward_greedy(const StepInput& step, const KvCacheView& cache, std::span<int32_t> tokens) override {
    return inner_->forward_greedy(step, cache, tokens);
  }
  Status forward_top_k(const StepInput& step, const KvCacheView& cache, std::span<uint64_t> keys) override {
    return inner_->forward_top_k(step, cache, keys);
  }
  Status logits_row(int64_t r, std::span<float> out) override { return inner_->logits_row(r, out); }

 protected:
  std::unique_ptr<ModelRunner> inner_;
};

// Runs every step of the engine twice: forward() for the engine's sampler, then forward_greedy()
// on the same inputs (which rewrites the same K/V), and compares its ids with the first maximum
// of each logits row, found here with std::max_element.
class GreedyCheckRunner final : public ForwardingRunner {
 public:
  GreedyCheckRunner(std::unique_ptr<ModelRunner> inner, std::shared_ptr<GreedyCheck> check)
      : ForwardingRunner(std::move(inner)), check_(std::move(check)) {}
  Status forward(const StepInput& step, const KvCacheView& cache, std::span<float> logits) override {
    QVL_RETURN_IF_ERROR(inner_->forward(step, cache, logits));
    const size_t R = step.logits_rows.size(), V = static_cast<size_t>(info().vocab_size);
    std::vector<int32_t> ids(R, -1);
    QVL_RETURN_IF_ERROR(inner_->forward_greedy(step, cache, ids));
    ++check_->steps;
    check_->rows += static_cast<int>(R);
    check_->steps_without_rows += R == 0;
    check_->steps_with_several_rows += R > 1;
    for (size_t r = 0; r < R; ++r) {
      std::span<const float> row = logits.subspan(r * V, V);
      check_->nans += static_cast<int>(std::count_if(row.begin(), row.end(), [](float v) { return std::isnan(v); }));
      if (ids[r] != std::max_element(row.begin(), row.end()) - row.begin()) ++check_->mismatches;
    }
    return Status::ok();
  }
  // The engine's own greedy and candidate steps run through the checking forward() above too
  // (ModelRunner's defaults), not straight to the wrapped runner.
  Status forward_greedy(const StepInput& step, const KvCacheView& cache, std::span<int32_t> tokens) override {
    return ModelRunner::forward_greedy(step, cache, tokens);
  }
  Status forward_top_k(const StepInput& step, const KvCacheView& cache, std::span<uint64_t> keys) override {
    return ModelRunner::forward_top_k(step, cache, keys);
  }
  Status logits_row(int64_t r, std::span<float> out) override { return ModelRunner::logits_row(r, out); }

 private:
  std::shared_ptr<GreedyCheck> check_;
};

// Passes every call through, counting the steps that took each path.
struct PathCounts {
  int forward = 0, greedy = 0, top_k = 0, whole_rows = 0;
};
class CountingRunner final : public ForwardingRunner {
 public:
  CountingRunner(std::unique_ptr<ModelRunner> inner, std::shared_ptr<PathCounts> counts)
      : ForwardingRunner(std::move(inner)), counts_(std::move(counts)) {}
  Status forward(const StepInput& step, const KvCacheView& cache, std::span<float> logits) override {
    ++counts_->forward;
    return inner_->forward(step, cache, logits);
  }
  Status forward_greedy(const StepInput& step, const KvCacheView& cache, std::span<int32_t> tokens) override {
    ++counts_->greedy;
    return inner_->forward_greedy(step, cache, tokens);
  }
  Status forward_top_k(const StepInput& step, const KvCacheView& cache, std::span<uint64_t> keys) override {
    ++counts_->top_k;
    return inner_->forward_top_k(step, cache, keys);
  }
  Status logits_row(int64_t r, std::span<float> out) override {
    ++counts_->whole_rows;
    return inner_->logits_row(r, out);
  }

 private:
  std::shared_ptr<PathCounts> counts_;
};

// Runs `reqs` on `a`, then on `b`: every request gives `tokens` tokens, the same on both. Returns
// a's tokens.
std::vector<std::vector<int32_t>> expect_same_tokens(Engine& a, Engine& b, const std::vector<GenerationRequest>& reqs,
                                                     size_t tokens) {
  const auto want = run_all(a, reqs);
  const auto got = run_all(b, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(want[i].size(), tokens) << "request " << i;
    EXPECT_EQ(got[i], want[i]) << "request " << i;
  }
  return want;
}

// Wraps an engine's runner in a CountingRunner that counts into `c`.
WrapRunner counting(std::shared_ptr<PathCounts> c) {
  return [c](std::unique_ptr<ModelRunner> inner) -> std::unique_ptr<ModelRunner> {
    return std::make_unique<CountingRunner>(std::move(inner), c);
  };
}

// Marks every third row of the candidate steps kTopKFallback, as a device does for a row with a
// NaN or more candidates than it holds.
class FallbackRunner final : public ForwardingRunner {
 public:
  using ForwardingRunner::ForwardingRunner;
  Status forward_top_k(const StepInput& step, const KvCacheView& cache, std::span<uint64_t> keys) override {
    QVL_RETURN_IF_ERROR(inner_->forward_top_k(step, cache, keys));
    for (size_t r = 0; r < step.logits_rows.size(); ++r)
      if (++rows_ % 3 == 0) keys[r * kSampleCandidates] = kTopKFallback;
    return Status::ok();
  }

 private:
  int rows_ = 0;
};

// Five requests of a busy run: three greedy ones (prompt salts 0, 6 and 7, whose greedy tokens
// differ on the tiny model, so that a token handed to the wrong sequence shows), one sampled and
// one greedy with a repetition penalty.
std::vector<GenerationRequest> mixed_requests() {
  std::vector<GenerationRequest> reqs;
  for (int i : {0, 1, 2, 6, 7}) reqs.push_back(make_request({random_image(4, 2 + 2 * (i % 2), 40 + i)}, i, 10));
  reqs[1].sampling.temperature = 0.8f;
  reqs[1].sampling.top_k = 40;
  reqs[1].sampling.seed = 7;
  reqs[2].sampling.repetition_penalty = 1.5f;
  return reqs;
}

TEST(EngineModel, ForwardGreedyIsTheArgmaxOfTheForwardLogits) {
  auto check = std::make_shared<GreedyCheck>();
  auto wrap = [&](std::unique_ptr<ModelRunner> inner) -> std::unique_ptr<ModelRunner> {
    return std::make_unique<GreedyCheckRunner>(std::move(inner), check);
  };
  // Greedy requests only, 7-row steps (prompts chunked beside decodes: steps with no logits row,
  // with one and with several), decode graphs on (the bucketed decode shape).
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(make_request({random_image(2, 2 + 2 * (i % 2), 50 + i)}, i, 9));
  auto checked = make_tiny_engine(4, 7, 64, 4, /*decode_graphs=*/true, /*device_greedy=*/false, wrap);
  auto got = run_all(*checked, reqs);
  EXPECT_GT(check->steps, 10);
  EXPECT_GT(check->steps_without_rows, 0);
  EXPECT_GT(check->steps_with_several_rows, 0);
  EXPECT_EQ(check->rows, 4 * 9);  // one row per generated token
  EXPECT_EQ(check->nans, 0);      // finite logits: max_element is the greedy rule here
  EXPECT_EQ(check->mismatches, 0) << "of " << check->rows << " rows";
  // Running each step twice changed nothing: the same tokens as a plain engine.
  auto plain = make_tiny_engine(4, 7, 64, 4, /*decode_graphs=*/true, /*device_greedy=*/false);
  EXPECT_EQ(got, run_all(*plain, reqs));
}

TEST(EngineModel, DeviceGreedyOnAndOffGiveTheSameTokens) {
  const std::vector<GenerationRequest> reqs = mixed_requests();
  // The penalised request must pick other tokens than its plain greedy twin, or taking it down
  // the device path by mistake would go unnoticed.
  GenerationRequest twin = reqs[2];
  twin.sampling.repetition_penalty = 1.0f;
  auto alone = make_tiny_engine(1, 64, 64, 4, /*decode_graphs=*/false, /*device_greedy=*/false);
  ASSERT_NE(run_all(*alone, {twin})[0], run_all(*alone, {reqs[2]})[0]);
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "decode graphs" : "eager");
    auto host_counts = std::make_shared<PathCounts>(), device_counts = std::make_shared<PathCounts>();
    // 7-row steps and 30 pages: chunked prompts, preemption.
    auto host = make_tiny_engine(4, 7, 30, 4, graphs, /*device_greedy=*/false, counting(host_counts),
                                 /*device_top_k=*/false);
    auto device = make_tiny_engine(4, 7, 30, 4, graphs, /*device_greedy=*/true, counting(device_counts),
                                   /*device_top_k=*/false);
    const auto want = expect_same_tokens(*host, *device, reqs, 10);
    ASSERT_TRUE(want[0] != want[3] && want[0] != want[4] && want[3] != want[4]) << "the greedy requests must differ";
    // Without the sampled request, a penalised row is the only thing keeping a step on the host.
    const std::vector<GenerationRequest> no_sampled = {reqs[0], reqs[2], reqs[3], reqs[4]};
    EXPECT_EQ(run_all(*device, no_sampled), run_all(*host, no_sampled));
    // Greedy requests only: every step with a logits row takes the device path, several rows at once.
    const int before = device_counts->greedy;
    EXPECT_EQ(run_all(*device, {reqs[0], reqs[3], reqs[4]}),
              (std::vector<std::vector<int32_t>>{want[0], want[3], want[4]}));
    EXPECT_EQ(host_counts->greedy, 0);
    EXPECT_GT(before, 0);                          // the mixed runs had all-greedy steps
    EXPECT_GE(device_counts->greedy - before, 9);  // at least the 9 decode steps after the first token
  }
}

// Sampled requests through the candidate keys (ModelRunner::forward_top_k: the CPU backend's
// top_k_rows inside the real runner) give the host sampler's tokens over whole rows, for
// Qwen's defaults, penalties (which sometimes leave a row to its whole logits) and greedy with a
// penalty, side by side with plain greedy requests, eager and through the decode graph shapes.
TEST(EngineModel, CandidateSamplingGivesTheWholeRowTokens) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(make_request({random_image(2, 2 + 2 * (i % 2), 60 + i)}, i, 24));
  auto sampled = [](GenerationRequest& r, float t, int k, float p, uint64_t seed) {
    r.sampling.temperature = t;
    r.sampling.top_k = k;
    r.sampling.top_p = p;
    r.sampling.seed = seed;
  };
  sampled(reqs[0], 0.7f, 20, 0.8f, 1);  // Qwen3-VL's generation_config
  sampled(reqs[1], 1.0f, 40, 1.0f, 2);
  reqs[1].sampling.repetition_penalty = 1.3f;
  sampled(reqs[2], 0.5f, 5, 0.9f, 3);
  reqs[2].sampling.presence_penalty = 1.5f;
  reqs[2].sampling.frequency_penalty = 0.5f;
  sampled(reqs[3], 1.5f, 63, 0.95f, 4);
  reqs[3].sampling.min_p = 0.05f;
  reqs[4].sampling.repetition_penalty = 2.0f;  // greedy with a penalty
  // reqs[5] plain greedy
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "decode graphs" : "eager");
    auto host_counts = std::make_shared<PathCounts>(), keys_counts = std::make_shared<PathCounts>();
    auto host = make_tiny_engine(4, 7, 30, 4, graphs, /*device_greedy=*/true, counting(host_counts),
                                 /*device_top_k=*/false);
    auto keys = make_tiny_engine(4, 7, 30, 4, graphs, /*device_greedy=*/true, counting(keys_counts),
                                 /*device_top_k=*/true);
    const auto want = expect_same_tokens(*host, *keys, reqs, 24);
    EXPECT_EQ(host_counts->top_k, 0);
    EXPECT_GT(keys_counts->top_k, 24);  // every step with a logits row of the busy run
    // Rows whose keys say "take the whole row" (as a NaN or a full device buffer does) fetch
    // their logits and still give the same tokens.
    auto fallback_counts = std::make_shared<PathCounts>();
    auto fallback = make_tiny_engine(
        4, 7, 30, 4, graphs, /*device_greedy=*/true,
        [&](std::unique_ptr<ModelRunner> inner) -> std::unique_ptr<ModelRunner> {
          return std::make_unique<FallbackRunner>(std::make_unique<CountingRunner>(std::move(inner), fallback_counts));
        },
        /*device_top_k=*/true);
    EXPECT_EQ(run_all(*fallback, reqs), want);
    EXPECT_GT(fallback_counts->whole_rows, 10);
    // The same seed again, alone: the draws do not depend on the batch or on the path.
    EXPECT_EQ(run_all(*keys, {reqs[0]})[0], want[0]);
  }
}

}  // namespace
}  // namespace qvl
