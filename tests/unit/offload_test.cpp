// Layer offload (memory/offload.h) on the CPU backend, whose "host memory" and prefetches are
// plain memory and memcpy: with every number of offloaded layers the logits of a prompt with an
// image (prefill whole and in chunks of 1, then decode) are bit-identical to the resident
// model's, which checks the schedule (each slot refilled only after the layer that used it ran,
// with the right layer) and the layout (tensors moved from slot 0 to their own slot). Also: the
// staging and host sizes against the plan, offloaded tensors living in the staging buffers, and
// the errors. The CUDA side (a second stream, graphs) is tests/gpu/gpu_offload_test.cpp.
#include "memory/offload.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "io/checkpoint.h"
#include "io/gen_model.h"
#include "memory/planner.h"
#include "model/bind.h"
#include "model/load.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/runner.h"
#include "support/test_support.h"

namespace qvl {
namespace {

struct Checkpointed {
  ModelConfig config;
  std::string dir;
  std::unique_ptr<Checkpoint> ckpt;
  ModelWeights host;
};

Checkpointed make_checkpoint(const std::string& preset) {
  Checkpointed c;
  c.config = preset_config(preset).value();
  c.dir = test::scratch_dir("offload_" + preset);
  GenModelOptions gen;
  gen.seed = 7;
  gen.max_shard_bytes = kTinyMaxShardBytes;
  Status st = generate_model(c.config, gen, c.dir);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  c.ckpt = std::make_unique<Checkpoint>(Checkpoint::open(c.dir).value());
  c.host = bind_host_weights(*c.ckpt, c.config).value();
  return c;
}

// Prefill logits of the last 3 prompt rows, then 4 decode steps, all concatenated.
std::vector<float> run(const Qwen3VLModel& model, int chunk) {
  const ModelConfig& cfg = model.config();
  std::vector<int32_t> ids = {151644, 872, 198, 151652};
  ids.insert(ids.end(), 6, cfg.tokens.image_token_id);  // grid 1x4x6 -> 6 tokens
  ids.insert(ids.end(), {151653, 42, 9000, 311, 151645, 198, 151644, 77091, 198});
  std::vector<float> px(static_cast<size_t>(24 * cfg.vision.patch_dim()));
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<float>((i * 37) % 101) / 50.0f - 1.0f;
  std::vector<ImageInput> images = {{px.data(), ImageGrid{1, 4, 6}}};
  SequenceRunner::Options opt;
  opt.max_tokens = 64;
  opt.prefill_chunk = chunk;
  auto r = SequenceRunner::create(model, opt);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  std::vector<float> out = (*r)->prefill(ids, images, 3).value();
  for (int32_t tok : {17, 151645, 198, 5000}) {
    std::vector<float> d = (*r)->decode(tok).value();
    out.insert(out.end(), d.begin(), d.end());
  }
  return out;
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void check_preset(const std::string& preset) {
  SCOPED_TRACE(preset);
  auto be = make_cpu_backend(2);
  Checkpointed c = make_checkpoint(preset);
  const int L = c.config.text.num_hidden_layers;
  auto resident = Qwen3VLModel::create(*be, c.config, load_weights(*be, c.host).value()).value();
  const std::vector<float> want = run(*resident, 0);
  const int64_t layer = weight_bytes(c.config).largest_layer;
  for (int n = 1; n <= L; ++n) {
    SCOPED_TRACE("offload " + std::to_string(n) + " of " + std::to_string(L));
    OffloadStats stats;
    Result<ModelWeights> w = load_weights_offloaded(*be, c.config, c.host, n, &stats);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    ASSERT_NE(w->layer_stream, nullptr);
    EXPECT_EQ(w->layer_stream->num_streamed(), n);
    // Staging: min(n, 2) slots of the plan's largest layer; the host holds each layer's bytes,
    // at most one slot each.
    EXPECT_EQ(stats.layers, n);
    EXPECT_EQ(stats.slot_bytes, layer);
    EXPECT_EQ(stats.staging_bytes, std::min(n, 2) * layer);
    EXPECT_GT(stats.host_bytes, 0);
    EXPECT_LE(stats.host_bytes, n * layer);
    // Offloaded layers are the last n and live in the staging buffers (the first offloaded
    // layer's first tensor opens slot 0); the resident ones do not.
    const char* staging_lo = static_cast<const char*>(w->text.layers[L - n].input_norm.data);
    for (int l = 0; l < L; ++l) {
      const char* p = static_cast<const char*>(w->text.layers[l].gate_up.parts[0].weight.data);
      const bool in_staging = p >= staging_lo && p < staging_lo + stats.staging_bytes;
      EXPECT_EQ(in_staging, l >= L - n) << "layer " << l;
    }
    auto model = Qwen3VLModel::create(*be, c.config, std::move(w).value()).value();
    EXPECT_TRUE(bit_identical(run(*model, 0), want)) << "whole prompt";
    EXPECT_TRUE(bit_identical(run(*model, 1), want)) << "chunks of one row";
  }
  std::filesystem::remove_all(c.dir);
}

TEST(Offload, LogitsAreBitIdenticalForEveryNumberOfLayers) {
  check_preset("tiny");      // 4 layers: slots reused twice
  check_preset("tiny-fp8");  // FP8 weights with their block scales
}

TEST(Offload, NoLayersIsPlainLoading) {
  auto be = make_cpu_backend(1);
  Checkpointed c = make_checkpoint("tiny");
  OffloadStats stats;
  Result<ModelWeights> w = load_weights_offloaded(*be, c.config, c.host, 0, &stats);
  ASSERT_TRUE(w.is_ok());
  EXPECT_EQ(w->layer_stream, nullptr);
  EXPECT_EQ(stats.layers, 0);
  EXPECT_EQ(stats.staging_bytes, 0);
  std::filesystem::remove_all(c.dir);
}

TEST(Offload, ErrorsNameTheLayers) {
  auto be = make_cpu_backend(1);
  Checkpointed c = make_checkpoint("tiny");
  Result<ModelWeights> w = load_weights_offloaded(*be, c.config, c.host, 5, nullptr);
  ASSERT_FALSE(w.is_ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("--offload-layers 5: the model has 4 decoder layers"), std::string::npos)
      << w.status().message();
  std::filesystem::remove_all(c.dir);
}

TEST(WeightPlacement, HandsOutAlignedPiecesAndSaysWhenFull) {
  alignas(256) static char buffer[1024];
  WeightPlacement p(buffer, sizeof buffer);
  EXPECT_EQ(p.take(10), buffer);
  EXPECT_EQ(p.take(300), buffer + 256);  // aligned to 256
  EXPECT_EQ(p.used(), 556u);
  EXPECT_EQ(p.take(500), nullptr);  // 768 + 500 > 1024
  EXPECT_EQ(p.wanted(), 1268u);
  EXPECT_EQ(p.used(), 556u);
}

}  // namespace
}  // namespace qvl
