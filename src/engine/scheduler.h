// The scheduler: which sequences run in the next step and how many tokens each feeds, under the
// step token budget, the running-batch size and the KV pages (the rules are listed in
// engine/factory.h). It owns the queue and the running batch, hands out pages, encodes images
// when a prefill chunk reaches them (one image's features alive at a time), and builds the
// StepInput. It knows nothing of threads, sampling or events: the engine loop (engine_impl.cpp)
// calls schedule(), runs the forward, calls commit(), samples, and retires what finished.
//
// A sequence is a token list (prompt, then every sampled token) and num_cached, how many of them
// have K/V in the cache. A step feeds tokens[num_cached, num_cached + n); when that reaches the
// end of the list the step also yields logits, the engine samples and appends a token. Decoding
// is the case n = 1; preemption sets num_cached back to 0, so recomputation is a prefill of the
// whole list and needs no special path.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "engine/factory.h"
#include "engine/request_state.h"
#include "engine/sampler.h"

namespace qvl::engine_detail {

using Clock = std::chrono::steady_clock;

struct ImageSpan {
  int64_t start = 0;  // index of the first pad token of the image in the prompt
  int64_t length = 0;
  int64_t end() const { return start + length; }
};

// The pad runs of `image_token_id` in `prompt`, in order.
std::vector<ImageSpan> find_image_spans(std::span<const int32_t> prompt, int32_t image_token_id);

struct Sequence {
  uint64_t id = 0;  // arrival order
  std::shared_ptr<RequestState> state;
  GenerationRequest request;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int64_t prompt_len = 0;
  std::vector<int32_t> prompt_positions;  // [prompt_len, 3]
  int64_t rope_delta = 0;
  std::vector<ImageSpan> images;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<TokenTextStream> text;

  int64_t num_cached = 0;
  PageTable pages;
  int live_image = -1;  // index into images whose features are alive, or -1
  std::unique_ptr<ImageFeatures> features;
  int generated = 0;
  int preemptions = 0;

  Clock::time_point submitted;
  Clock::time_point first_scheduled, first_token, last_token;
  bool was_scheduled = false;
  double vision_ms = 0, prefill_ms = 0;

  bool prefilling() const { return static_cast<int64_t>(tokens.size()) - num_cached > 1; }
  // M-RoPE position of token `index` on axis `axis` (prompt: precomputed; later: index + delta).
  int32_t position(int64_t index, int axis) const;
};

class Scheduler {
 public:
  Scheduler(KvPagePool& pool, ModelRunner& runner, const EngineOptions& options);

  // A sequence whose preparation failed or whose step failed, with the reason.
  struct Failure {
    std::unique_ptr<Sequence> seq;
    Status status;
  };

  struct Plan {
    StepInput input;
    std::vector<Sequence*> seqs;     // in row order
    std::vector<int64_t> counts;     // tokens fed per sequence
    std::vector<bool> wants_logits;  // per sequence
    std::vector<Failure> failed;     // dropped while planning (image encoding errors, no memory)
    bool empty() const { return seqs.empty(); }
  };

  void enqueue(std::unique_ptr<Sequence> seq);
  // Chooses the next step (may be empty: nothing runnable).
  Plan schedule();
  // After a successful forward of `plan`: advances num_cached and drops image features whose
  // rows are all in the cache.
  void commit(const Plan& plan);
  // Removes `seq` from the running batch or the queue, freeing its pages and features.
  std::unique_ptr<Sequence> remove(Sequence* seq);
  // Every sequence whose request was cancelled, removed as above.
  std::vector<std::unique_ptr<Sequence>> take_cancelled();
  // Everything, removed as above (shutdown).
  std::vector<std::unique_ptr<Sequence>> take_all();

  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  const std::vector<std::unique_ptr<Sequence>>& running() const { return running_; }
  const KvPagePool& pool() const { return pool_; }

 private:
  // Frees pages and features and resets num_cached; the sequence goes back to the queue head.
  void preempt(size_t running_index);
  void release(Sequence& seq);
  // Tokens of the next prefill chunk of `seq` within `budget`, encoding an image if the chunk
  // reaches one (0 when the chunk must wait for another sequence's image).
  Result<int64_t> prefill_chunk(Sequence& seq, int64_t budget);
  // Pages `seq` still needs to hold its whole token list plus the next token.
  int64_t pages_to_finish_prefill(const Sequence& seq) const;
  void add_to_plan(Plan& plan, Sequence& seq, int64_t n);

  KvPagePool& pool_;
  ModelRunner& runner_;
  EngineOptions options_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order: oldest first
  Sequence* image_owner_ = nullptr;                 // the sequence whose image features are alive
};

}  // namespace qvl::engine_detail
