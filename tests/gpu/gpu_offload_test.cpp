// Layer offload on CUDA (memory/offload.h): decoder layers streamed from pinned host memory on a
// second stream must give bit-identical logits to the resident model (same kernels, same weights,
// same layout), eager and inside recorded graphs, BF16 and FP8. The model has 2B-sized decoder
// layers (96 MiB BF16 each, a few ms over PCIe against ~0.1 ms of decode compute), so a copy that
// is not waited for, or a staging buffer refilled while its layer still reads it, shows up as
// different logits. Each case gets its own CUDA backend, so the weights are freed afterwards.
// Also prints the decode step time with and without offload and the host->device bandwidth the
// offloaded steps reached (figures for bench/RESULTS.md, not checked).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "backend/cuda/cuda_backend.h"
#include "core/arena.h"
#include "gpu/gpu_util.h"
#include "io/checkpoint.h"
#include "io/gen_model.h"
#include "memory/activations.h"
#include "memory/offload.h"
#include "model/bind.h"
#include "model/load.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/runner.h"
#include "support/test_support.h"

namespace qvl::test::gpu {
namespace {

// 2B text layers (hidden 2048, intermediate 6144), 4 of them, and a 2-block 2B vision tower.
ModelConfig mid_config(bool fp8) {
  ModelConfig c = preset_config("2b").value();
  c.text.num_hidden_layers = 4;
  c.vision.depth = 2;
  c.vision.deepstack_visual_indexes = {0, 1};
  if (fp8) make_fp8(&c);
  return c;
}

// Prefill logits of the last 3 prompt rows (an 8x8-patch image: 16 image tokens), then 4 decode
// steps, eager (SequenceRunner), concatenated.
std::vector<float> run_eager(const Qwen3VLModel& model) {
  const ModelConfig& cfg = model.config();
  std::vector<int32_t> ids = {151644, 872, 198, 151652};
  ids.insert(ids.end(), 16, cfg.tokens.image_token_id);
  ids.insert(ids.end(), {151653, 42, 9000, 311, 151645, 198, 151644, 77091, 198});
  std::vector<float> px(static_cast<size_t>(64 * cfg.vision.patch_dim()));
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<float>((i * 37) % 101) / 50.0f - 1.0f;
  std::vector<ImageInput> images = {{px.data(), ImageGrid{1, 8, 8}}};
  SequenceRunner::Options opt;
  opt.max_tokens = 64;
  auto r = SequenceRunner::create(model, opt);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  std::vector<float> out = (*r)->prefill(ids, images, 3).value();
  for (int32_t tok : {17, 151645, 198, 5000}) {
    std::vector<float> d = (*r)->decode(tok).value();
    out.insert(out.end(), d.begin(), d.end());
  }
  return out;
}

// Text-only decode steps, one token each, through Backend::run_graph (one recording replayed with
// new inputs, as the engine's decode steps) or eagerly. Returns the BF16 logits bits of every
// step; *step_ms gets the median time of the last steps.
std::vector<uint16_t> run_decode_steps(const Qwen3VLModel& model, bool graphs, double* step_ms) {
  Backend& be = model.backend();
  const ModelConfig& cfg = model.config();
  const int steps = 24, page = 16, pages = 2;
  KvCacheView cache;
  cache.dtype = DType::kBF16;
  cache.page_size = page;
  cache.num_pages = pages;
  cache.num_layers = cfg.text.num_hidden_layers;
  cache.num_kv_heads = cfg.text.num_key_value_heads;
  cache.head_dim = cfg.text.head_dim;
  DeviceBuffer kv = be.allocate(cache.page_bytes() * pages, "test KV").value();
  cache.base = kv.data();
  const RunnerBuffers rb = runner_buffers(cfg, RunnerShape{1, 1, pages, 0}, be.activation_dtype());
  DeviceBuffer arena_buf = be.allocate(static_cast<size_t>(rb.arena), "test arena").value();
  DeviceBuffer inputs = be.allocate(static_cast<size_t>(rb.step_inputs), "test inputs").value();
  DeviceBuffer logits_buf = be.allocate(static_cast<size_t>(rb.logits), "test logits").value();
  Arena arena(arena_buf.data(), arena_buf.size(), be.device(), "test arena");
  Arena in_arena(inputs.data(), inputs.size(), be.device(), "test inputs");
  TextBatch batch;
  batch.num_seqs = 1;
  batch.num_tokens = 1;
  batch.max_pages_per_seq = pages;
  batch.max_context = pages * page;  // fixed: the recording binds it
  TextStepInputs in;
  in.token_ids = in_arena.alloc(DType::kI32, {1});
  in.logits_rows = in_arena.alloc(DType::kI32, {1});
  batch.positions = in_arena.alloc(DType::kI32, {1, 3});
  batch.slots = in_arena.alloc(DType::kI32, {1});
  batch.query_start = in_arena.alloc(DType::kI32, {2});
  batch.context_len = in_arena.alloc(DType::kI32, {1});
  batch.page_table = in_arena.alloc(DType::kI32, {1, pages});
  Tensor logits(logits_buf.data(), DType::kBF16, {1, cfg.text.vocab_size}, be.device());
  const int32_t zero = 0, qs[2] = {0, 1}, table[pages] = {1, 0};  // pages out of order on purpose
  be.copy_to_device(in.logits_rows, &zero);
  be.copy_to_device(batch.query_start, qs);
  be.copy_to_device(batch.page_table, table);

  std::vector<uint16_t> out;
  std::vector<double> times;
  std::vector<uint16_t> host(static_cast<size_t>(cfg.text.vocab_size));
  for (int t = 0; t < steps; ++t) {
    const int32_t tok = 1000 + 37 * t, pos[3] = {t, t, t}, slot = table[t / page] * page + t % page, ctx = t + 1;
    be.copy_to_device(in.token_ids, &tok);
    be.copy_to_device(batch.positions, pos);
    be.copy_to_device(batch.slots, &slot);
    be.copy_to_device(batch.context_len, &ctx);
    be.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    auto fwd = [&] { model.forward(batch, in, cache, logits, arena); };
    if (graphs)
      be.run_graph("offload-test/decode", fwd);
    else
      fwd();
    be.synchronize();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    be.copy_to_host(host.data(), logits);
    out.insert(out.end(), host.begin(), host.end());
  }
  be.clear_graphs();
  std::vector<double> tail(times.begin() + steps / 2, times.end());
  std::sort(tail.begin(), tail.end());
  *step_ms = tail[tail.size() / 2];
  return out;
}

template <typename T>
bool bit_identical(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

void check(bool fp8) {
  const std::string label = fp8 ? "FP8" : "BF16";
  SCOPED_TRACE(label);
  const ModelConfig cfg = mid_config(fp8);
  const std::string dir = scratch_dir(std::string("gpu_offload_") + (fp8 ? "fp8" : "bf16"));
  GenModelOptions gen;
  gen.seed = 11;
  ASSERT_TRUE(generate_model(cfg, gen, dir).is_ok());
  Checkpoint ckpt = Checkpoint::open(dir).value();
  const ModelWeights host = bind_host_weights(ckpt, cfg).value();
  CudaBackendOptions options;
  options.fused_decode = false;  // resident and offloaded steps run the same per-layer kernels
  auto made = make_cuda_backend(options);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  std::unique_ptr<Backend> be = std::move(made).value();

  std::vector<float> want;
  std::vector<uint16_t> want_steps;
  double resident_ms = 0;
  {
    auto model = Qwen3VLModel::create(*be, cfg, load_weights(*be, host).value()).value();
    want = run_eager(*model);
    double eager_ms = 0;
    want_steps = run_decode_steps(*model, false, &eager_ms);
    std::vector<uint16_t> graph_steps = run_decode_steps(*model, true, &resident_ms);
    EXPECT_TRUE(bit_identical(graph_steps, want_steps)) << "resident: graph replay vs eager";
  }
  const int L = cfg.text.num_hidden_layers;
  for (int n = 1; n <= L; ++n) {
    SCOPED_TRACE("offload " + std::to_string(n) + " of " + std::to_string(L));
    OffloadStats stats;
    auto w = load_weights_offloaded(*be, cfg, host, n, &stats);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    auto model = Qwen3VLModel::create(*be, cfg, std::move(w).value()).value();
    const bool eager_ok = bit_identical(run_eager(*model), want);
    double eager_ms = 0, graph_ms = 0;
    const bool steps_ok = bit_identical(run_decode_steps(*model, false, &eager_ms), want_steps);
    const bool graph_ok = bit_identical(run_decode_steps(*model, true, &graph_ms), want_steps);
    EXPECT_TRUE(eager_ok) << "image prompt + decode, eager";
    EXPECT_TRUE(steps_ok) << "decode steps, eager";
    EXPECT_TRUE(graph_ok) << "decode steps, recorded graph";
    CheckRow row;
    row.op = "offload " + label;
    row.shape = std::to_string(n) + " of " + std::to_string(L) + " layers";
    row.pass = eager_ok && steps_ok && graph_ok;
    record(row);
    // Each offloaded step copies every offloaded layer once.
    const double gbps = static_cast<double>(stats.host_bytes) / (graph_ms * 1e-3) / 1e9;
    std::printf(
        "offload %s %d/%d layers (%.1f MiB host): decode step %.3f ms (graph; eager %.3f) vs resident %.3f ms,"
        " %.1f GB/s host->device\n",
        label.c_str(), n, L, stats.host_bytes / 1048576.0, graph_ms, eager_ms, resident_ms, gbps);
  }
  std::filesystem::remove_all(dir);
}

TEST(GpuOffload, LogitsAreBitIdenticalWithAndWithoutOffload) {
  QVL_REQUIRE_CUDA();
  check(false);
  check(true);
}

}  // namespace
}  // namespace qvl::test::gpu
