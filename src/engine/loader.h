// Loading a model for serving: model directory -> config, tokenizer, memory plan, weights on the
// backend, Qwen3VLModel, runner, KV page pool, and a running Engine — the one sequence that
// `qvl run` and `qvl serve` share. The caller (src/cli) resolves the model name to a directory,
// makes the backend (CPU or CUDA) and measures the device; everything here is plain data in.
//
// Memory: the plan (memory/planner.h) decides before any weight is read. With a budget (a GPU)
// a plan that does not fit fails at once with the shortfall and the cheapest changes; the KV
// pool may then grow up to the plan's kv_capacity_pages. Without one (the CPU backend) the pool
// may grow to what `concurrency` full contexts need.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/status.h"
#include "engine/engine.h"
#include "engine/factory.h"
#include "engine/text_stream.h"
#include "image/image.h"
#include "memory/offload.h"
#include "memory/planner.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

namespace qvl {

// A tokenizer loading on a thread of its own, and the directory it reads.
struct TokenizerLoad {
  std::string dir;
  std::shared_future<Result<std::shared_ptr<const Tokenizer>>> result;
};
// Starts loading `dir`'s tokenizer (parsing Qwen's 11 MB tokenizer.json takes 0.3-0.5 s), to run
// beside the backend's creation and the weights' upload.
TokenizerLoad start_tokenizer_load(const std::string& dir);

struct LoadOptions {
  std::string model_dir;
  std::string tokenizer_dir;  // "" = model_dir (tokenizer.json + tokenizer_config.json)
  RuntimeOptions runtime;     // context, concurrency, image caps, prefill chunk, KV dtype/page, budget
  DeviceFacts device;         // all zero for the CPU backend
  int max_queued = 1024;
  int sampling_threads = 0;          // 0 = OpenMP's default (EngineOptions::sampling_threads)
  DType kv_dtype_cpu = DType::kF32;  // the CPU backend keeps the cache in fp32 (the oracle's numerics)
  // When the plan does not fit the budget, load with auto_fit()'s options instead of refusing
  // (LoadedModel::auto_fit_applied says what changed). Without a budget (CPU) there is nothing
  // to fit and it does nothing.
  bool auto_fit = false;
  // The tokenizer, when the caller started loading it early (start_tokenizer_load, before making
  // the backend: its CUDA context takes ~0.2 s). load_model takes it if it is from the directory
  // it would read (tokenizer_dir, or model_dir), and otherwise starts its own.
  TokenizerLoad tokenizer;
};

struct LoadedModel {
  ModelConfig config;
  MemoryPlan plan;                           // the plan loaded (after auto-fit)
  std::vector<Suggestion> auto_fit_applied;  // what auto-fit changed, cheapest first
  OffloadStats offload;                      // layers in host memory (memory/offload.h)
  std::shared_ptr<const Tokenizer> tokenizer;
  image::PreprocessOptions image_options;  // preprocessor_config.json + the plan's pixel cap
  int64_t context_length = 0;              // prompt + completion tokens per request
  EngineOptions engine_options;
  std::shared_ptr<Engine> engine;
};

// Loads everything and starts the engine. Errors name the file, tensor or option at fault.
Result<LoadedModel> load_model(std::shared_ptr<Backend> backend, const LoadOptions& options);

// Text streams over the tokenizer's streaming detokenizer (special tokens skipped).
TextStreamFactory make_text_streams(std::shared_ptr<const Tokenizer> tokenizer);

// One paragraph for people: why a plan does not fit and what to change, cheapest first.
std::string explain_plan_shortfall(const MemoryPlan& plan);

}  // namespace qvl
