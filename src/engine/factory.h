// Building an Engine (engine.h) from its parts: a ModelRunner (the model on a backend), the KV
// page pool sized by the memory plan, and the factory of per-request text streams (tokenizer
// detokenizer + stop strings). make_engine starts the engine thread; the Engine's destructor
// shuts it down (cancelling what still runs) and joins it.
//
// Scheduling, in one sentence per rule (engine/scheduler.cpp):
// - every step first feeds one token to each running sequence that is decoding, then spends the
//   rest of `max_step_tokens` on prompt chunks (chunked prefill), oldest sequence first;
// - waiting requests are admitted in arrival order while fewer than `max_running` run and the
//   pool can hold the whole prompt plus one token; the head of the queue is never overtaken;
// - when a decoding sequence needs a page and none is left, the youngest running sequence is
//   preempted: its pages are freed and it goes back to the head of the queue, to be recomputed
//   from its tokens later (already streamed text is never repeated);
// - a request whose prompt + max_tokens exceeds max_context or the whole KV budget is refused at
//   submit with the numbers.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/text_stream.h"
#include "memory/kv_pool.h"

namespace qvl {

struct EngineOptions {
  int max_running = 16;                // sequences in the running batch
  int max_step_tokens = 512;           // rows per forward: decodes + prefill chunks (the prefill chunk)
  int64_t max_context = 4096;          // prompt + completion tokens per sequence
  int max_queued = 1024;               // waiting requests beyond the running batch; more -> refused
  int sampling_threads = 0;            // threads sampling the rows of a step; 0 = OpenMP's default
  std::vector<int32_t> eos_token_ids;  // generation_config eos ids (ignored with ignore_eos)
  // Steps whose sampled rows are all plain greedy (temperature 0, no penalties) take the argmax
  // where the logits are (ModelRunner::forward_greedy) instead of bringing them to the host.
  bool device_greedy = true;
  // Steps whose sampled rows can all draw from their largest logits (greedy, or top-k below
  // kSampleCandidates, with penalties that only lower scores: Sampler::can_sample_candidates)
  // bring back kSampleCandidates keys per row (ModelRunner::forward_top_k) instead of the rows;
  // a row whose keys do not decide its token fetches its logits (ModelRunner::logits_row). The
  // tokens are those of the host sampler over the whole rows.
  bool device_top_k = true;
};

// The limits a runner must be built for to serve an engine with `options` and `page_size`.
RunnerLimits runner_limits(const EngineOptions& options, int page_size, int64_t max_image_patches);

// Validates the options against the runner and the pool, then starts the engine thread.
Result<std::unique_ptr<Engine>> make_engine(std::unique_ptr<ModelRunner> runner, std::unique_ptr<KvPagePool> pool,
                                            TextStreamFactory text_streams, EngineOptions options);

}  // namespace qvl
