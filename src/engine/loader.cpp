#include "engine/loader.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>

#include "core/check.h"
#include "core/log.h"
#include "engine/qwen3vl_runner.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "memory/kv_pool.h"
#include "memory/quantize.h"
#include "model/bind.h"
#include "model/load.h"
#include "model/model.h"
#include "tokenizer/detokenizer.h"

namespace qvl {

namespace {

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

class DetokenizerStream final : public TokenTextStream {
 public:
  DetokenizerStream(std::shared_ptr<const Tokenizer> tokenizer, const std::vector<std::string>& stop)
      : tokenizer_(std::move(tokenizer)), detok_(*tokenizer_, DetokenizerOptions{true, stop}) {}
  Piece push(int32_t token) override {
    StreamingDetokenizer::Step s = detok_.push(token);
    return {std::move(s.text), s.stopped};
  }
  std::string finish() override { return detok_.finish().text; }

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;  // first: the detokenizer refers to it
  StreamingDetokenizer detok_;
};

}  // namespace

TextStreamFactory make_text_streams(std::shared_ptr<const Tokenizer> tokenizer) {
  QVL_CHECK(tokenizer != nullptr);
  return [tokenizer](const std::vector<std::string>& stop) {
    return std::unique_ptr<TokenTextStream>(new DetokenizerStream(tokenizer, stop));
  };
}

std::string explain_plan_shortfall(const MemoryPlan& plan) {
  std::string s = "the model does not fit: it needs " + mib(plan.peak_bytes + plan.margin_bytes) +
                  " but the budget is " + mib(plan.budget_bytes) + " (" + plan.budget_source + "), " +
                  mib(plan.shortfall_bytes) + " short";
  if (!plan.suggestions.empty()) {
    s += ". Cheapest changes:";
    for (const auto& sg : plan.suggestions) {
      s += "\n  " + sg.flag + " — " + sg.description + " (saves " + mib(sg.saves_bytes) + ")";
      if (sg.fits_alone) s += ", fits alone";
    }
  }
  return s;
}

TokenizerLoad start_tokenizer_load(const std::string& dir) {
  return {dir, std::async(std::launch::async, [dir] { return Tokenizer::load_dir(dir); }).share()};
}

Result<LoadedModel> load_model(std::shared_ptr<Backend> backend, const LoadOptions& options) {
  QVL_CHECK(backend != nullptr);
  // Where the load's time goes (--log-level debug): each phase's milliseconds.
  auto t = std::chrono::steady_clock::now();
  auto phase = [&t](const char* name) {
    const auto now = std::chrono::steady_clock::now();
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.1f ms", std::chrono::duration<double, std::milli>(now - t).count());
    log_debug(std::string("load: ") + name + " " + ms);
    t = now;
  };
  LoadedModel m;
  QVL_ASSIGN_OR_RETURN(m.config, load_model_config(options.model_dir));
  const bool on_cpu = backend->device() == Device::kCpu;

  // 1. The plan, before any weight is read.
  RuntimeOptions rt = options.runtime;
  rt.activation_dtype = backend->activation_dtype();
  rt.can_offload = backend->can_stream_weights();
  rt.can_quantize_fp8 = true;  // memory/quantize.h
  if (rt.offload_layers > 0 && !rt.can_offload)
    return unimplemented("--offload-layers " + std::to_string(rt.offload_layers) + ": the " + backend->name() +
                         " backend cannot stream weights from host memory");
  QVL_ASSIGN_OR_RETURN(m.plan, plan(m.config, rt, options.device));
  if (options.auto_fit && m.plan.has_budget && !m.plan.fits) {
    Result<AutoFit> fit = auto_fit(m.config, rt, options.device);
    if (!fit.is_ok())
      return resource_exhausted(explain_plan_shortfall(m.plan) + "\n--auto-fit: " + fit.status().message());
    rt = fit->options;
    m.plan = std::move(fit->plan);
    m.auto_fit_applied = std::move(fit->applied);
  }
  if (m.plan.has_budget && !m.plan.fits) return resource_exhausted(explain_plan_shortfall(m.plan));
  for (const auto& note : m.plan.notes) log_debug("plan: " + note);
  phase("config and plan");

  // 2. Tokenizer, weights, model. The tokenizer loads on a thread of its own (if the caller has
  // not started it already) while the weights go to the device.
  const std::string tok_dir = options.tokenizer_dir.empty() ? options.model_dir : options.tokenizer_dir;
  const TokenizerLoad tokenizer = options.tokenizer.result.valid() && options.tokenizer.dir == tok_dir
                                      ? options.tokenizer
                                      : start_tokenizer_load(tok_dir);
  QVL_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(options.model_dir));
  QVL_ASSIGN_OR_RETURN(ModelWeights host, bind_host_weights(checkpoint, m.config));
  phase("checkpoint opened");
  if (rt.fp8_weights && !m.config.quant.fp8) {
    QVL_ASSIGN_OR_RETURN(QuantizedWeights q, quantize_fp8_at_load(m.config, host, options.sampling_threads));
    log_info("FP8 weights: " + std::to_string(q.quantized_linears) +
             " text Linears of the BF16 checkpoint quantized at load (128x128 blocks)");
    m.config = std::move(q.config);
    host = std::move(q.host);
  }
  QVL_ASSIGN_OR_RETURN(ModelWeights weights,
                       load_weights_offloaded(*backend, m.config, host, rt.offload_layers, &m.offload));
  if (m.offload.layers > 0)
    log_info("offload: " + std::to_string(m.offload.layers) + " of " + std::to_string(m.config.text.num_hidden_layers) +
             " decoder layers in host memory (" + mib(m.offload.host_bytes) + "), streamed through " +
             mib(m.offload.staging_bytes) + " of device staging buffers");
  QVL_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3VLModel> model,
                       Qwen3VLModel::create(*backend, m.config, std::move(weights)));
  backend->end_loading();
  phase("weights on the device");
  QVL_ASSIGN_OR_RETURN(m.tokenizer, tokenizer.result.get());
  phase("tokenizer (after the weights)");

  // 3. Engine limits: exactly what the plan sized (runner buffers, page-table width).
  m.context_length = std::min<int64_t>(rt.context_tokens, m.config.text.max_position_embeddings);
  EngineOptions& eo = m.engine_options;
  eo.max_running = static_cast<int>(m.plan.max_seqs);
  eo.max_step_tokens = static_cast<int>(m.plan.decoder.step_tokens);
  eo.max_context = m.context_length;
  eo.max_queued = options.max_queued;
  eo.sampling_threads = options.sampling_threads;
  for (int id : m.config.generation.eos_token_ids) eo.eos_token_ids.push_back(id);
  // Candidate keys save a device's logits transfer; on the CPU the rows are already in host
  // memory, and finding the keys costs what the sampler's own pass over the row does.
  eo.device_top_k = !on_cpu;
  const int page = rt.kv_page_tokens;
  Qwen3VLRunnerOptions ro;
  ro.limits.max_step_tokens = eo.max_step_tokens;
  ro.limits.max_seqs = eo.max_running;
  ro.limits.max_pages_per_seq = static_cast<int>(m.plan.kv_pages_per_seq);
  ro.limits.max_image_patches = m.plan.image_patches;
  ro.kv_dtype = on_cpu ? options.kv_dtype_cpu : rt.kv_dtype;
  ro.decode_graphs = !on_cpu;
  QVL_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                       make_qwen3vl_runner(backend, std::shared_ptr<const Qwen3VLModel>(std::move(model)), ro));
  phase("runner");

  // 4. The KV pool: up to the plan's capacity (a budget) or `concurrency` full contexts.
  const KvLayout layout = runner->info().kv_layout;
  int64_t max_pages = m.plan.has_budget ? m.plan.kv_capacity_pages : m.plan.kv_required_pages;
  max_pages = std::max<int64_t>(max_pages, (m.context_length + page - 1) / page);
  const size_t page_bytes = layout.token_bytes() * page;
  QVL_ASSIGN_OR_RETURN(std::unique_ptr<DeviceRegion> storage,
                       make_kv_storage(*backend, page_bytes * static_cast<size_t>(max_pages)));
  KvPoolOptions po;
  po.page_size = page;
  po.max_pages = max_pages;
  // Grow in steps of about 64 MiB (at least one full context), so a short request commits little.
  po.grow_pages = std::max<int64_t>(
      {1, (int64_t{64} << 20) / static_cast<int64_t>(page_bytes), (m.context_length + page - 1) / page});
  QVL_ASSIGN_OR_RETURN(std::unique_ptr<KvPagePool> pool, KvPagePool::create(std::move(storage), layout, po));

  // 5. The engine thread.
  QVL_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                       make_engine(std::move(runner), std::move(pool), make_text_streams(m.tokenizer), eo));
  m.engine = std::move(engine);
  phase("KV pool and engine");

  // What the image pipeline may produce: the checkpoint's processor settings, capped by the plan.
  const PreprocessorConfig& pc = m.config.preprocessor;
  image::PreprocessOptions& io = m.image_options;
  io.min_pixels = pc.min_pixels;
  io.max_pixels = pc.max_pixels;
  io.patch_size = pc.patch_size;
  io.merge_size = pc.merge_size;
  io.temporal_patch_size = pc.temporal_patch_size;
  io.max_image_pixels = rt.max_image_pixels;
  io.max_image_tokens = std::max<int64_t>(1, m.plan.image_tokens);
  // Images reach the model as resized RGB bytes and are patchified on its backend.
  io.rgb_output = true;
  return m;
}

}  // namespace qvl
