// The Engine implementation: submit() validates and queues on the caller's thread; one engine
// thread runs the loop — take new requests, drop cancelled ones, schedule a step, run the
// forward, sample, stream the new text, retire what finished — until shutdown.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

#include "core/check.h"
#include "core/log.h"
#include "engine/factory.h"
#include "engine/scheduler.h"

namespace qvl {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "none";
}

RunnerLimits runner_limits(const EngineOptions& options, int page_size, int64_t max_image_patches) {
  RunnerLimits l;
  l.max_step_tokens = options.max_step_tokens;
  l.max_seqs = options.max_running;
  l.max_pages_per_seq = static_cast<int>((options.max_context + page_size - 1) / page_size);
  l.max_image_patches = max_image_patches;
  return l;
}

namespace engine_detail {
namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

class EngineImpl final : public Engine {
 public:
  EngineImpl(std::unique_ptr<ModelRunner> runner, std::unique_ptr<KvPagePool> pool, TextStreamFactory text_streams,
             EngineOptions options)
      : runner_(std::move(runner)),
        pool_(std::move(pool)),
        text_streams_(std::move(text_streams)),
        options_(std::move(options)),
        wakeup_(std::make_shared<Wakeup>()),
        scheduler_(*pool_, *runner_, options_) {
    // The largest logits block up front, so a busier step later does not grow the process.
    logits_.assign(static_cast<size_t>(options_.max_running) * runner_->info().vocab_size, 0.0f);
    publish_stats();
    thread_ = std::thread([this] { loop(); });
  }
  ~EngineImpl() override { shutdown(std::chrono::milliseconds(0)); }

  Result<std::unique_ptr<RequestStream>> submit(GenerationRequest request) override;
  EngineStats stats() const override;
  void shutdown(std::chrono::milliseconds deadline) override;

 private:
  struct Incoming {
    GenerationRequest request;
    std::shared_ptr<RequestState> state;
    Clock::time_point submitted;
  };

  Status validate(const GenerationRequest& request) const;
  void loop();
  void ingest();
  std::unique_ptr<Sequence> make_sequence(Incoming incoming);
  void run_step(Scheduler::Plan& plan);
  // Appends the sampled `token` to `seq`, streams its text; retires the sequence when done.
  void advance(Sequence* seq, int32_t token, Clock::time_point now);
  void finish(std::unique_ptr<Sequence> seq, FinishReason reason, Status error, GenerationEvent event = {});
  void cancel_everything();
  void publish_stats();

  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<KvPagePool> pool_;
  TextStreamFactory text_streams_;
  EngineOptions options_;
  std::shared_ptr<Wakeup> wakeup_;
  Scheduler scheduler_;  // engine thread only
  std::vector<float> logits_;
  uint64_t next_id_ = 0;
  std::random_device entropy_;

  mutable std::mutex mu_;  // guards incoming_, stopping_, deadline_
  std::deque<Incoming> incoming_;
  bool stopping_ = false;
  Clock::time_point deadline_;
  std::mutex join_mu_;
  std::thread thread_;

  std::atomic<int> stat_queued_{0}, stat_running_{0};
  std::atomic<int64_t> stat_pages_used_{0}, stat_pages_available_{0}, stat_max_pages_{0};
};

Status EngineImpl::validate(const GenerationRequest& request) const {
  QVL_RETURN_IF_ERROR(validate_sampling_params(request.sampling));
  const ModelInfo& info = runner_->info();
  const auto& prompt = request.prompt_ids;
  if (prompt.empty()) return invalid_argument("the prompt has no tokens");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= info.vocab_size)
      return invalid_argument("prompt token " + std::to_string(i) + " has id " + std::to_string(prompt[i]) +
                              " outside the vocabulary of " + std::to_string(info.vocab_size));
  auto spans = find_image_spans(prompt, info.image_token_id);
  if (spans.size() != request.images.size())
    return invalid_argument("the prompt has " + std::to_string(spans.size()) + " image pad runs but " +
                            std::to_string(request.images.size()) + " images were given");
  for (size_t i = 0; i < spans.size(); ++i) {
    const PreparedImage& img = request.images[i];
    if (img.num_patches() != spans[i].length * info.merge_unit)
      return invalid_argument("image " + std::to_string(i + 1) + " (grid " + std::to_string(img.grid_t) + "×" +
                              std::to_string(img.grid_h) + "×" + std::to_string(img.grid_w) + ") makes " +
                              std::to_string(img.num_patches() / info.merge_unit) + " tokens but its pad run has " +
                              std::to_string(spans[i].length));
  }
  const int64_t total = static_cast<int64_t>(prompt.size()) + request.sampling.max_tokens;
  if (total > options_.max_context)
    return out_of_range("prompt of " + std::to_string(prompt.size()) + " tokens + max_tokens " +
                        std::to_string(request.sampling.max_tokens) + " = " + std::to_string(total) +
                        " tokens exceeds the context of " + std::to_string(options_.max_context) + " tokens");
  const int64_t pages = pool_->pages_for(total), max_pages = stat_max_pages_.load();
  if (pages > max_pages)
    return resource_exhausted("prompt + max_tokens = " + std::to_string(total) + " tokens need " +
                              std::to_string(pages) + " KV pages but the cache holds " + std::to_string(max_pages) +
                              " pages (" + std::to_string(max_pages * pool_->page_size()) + " tokens)");
  return Status::ok();
}

Result<std::unique_ptr<RequestStream>> EngineImpl::submit(GenerationRequest request) {
  QVL_RETURN_IF_ERROR(validate(request));
  auto state = std::make_shared<RequestState>(wakeup_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return unavailable("the engine is shutting down");
    const int queued = stat_queued_.load() + static_cast<int>(incoming_.size());
    if (queued >= options_.max_queued)
      return resource_exhausted(std::to_string(queued) + " requests are already waiting (the queue holds " +
                                std::to_string(options_.max_queued) + ")");
    incoming_.push_back({std::move(request), state, Clock::now()});
  }
  wakeup_->notify();
  return std::unique_ptr<RequestStream>(new StreamHandle(std::move(state)));
}

EngineStats EngineImpl::stats() const {
  EngineStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.queued = stat_queued_.load() + static_cast<int>(incoming_.size());
  }
  s.running = stat_running_.load();
  s.kv_pages_used = stat_pages_used_.load();
  s.kv_pages_free = stat_pages_available_.load();
  s.kv_page_tokens = pool_->page_size();
  return s;
}

void EngineImpl::shutdown(std::chrono::milliseconds deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto when = Clock::now() + deadline;
    if (!stopping_ || when < deadline_) deadline_ = when;
    stopping_ = true;
  }
  wakeup_->notify();
  std::lock_guard<std::mutex> join_lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

void EngineImpl::publish_stats() {
  stat_queued_ = scheduler_.num_waiting();
  stat_running_ = scheduler_.num_running();
  stat_pages_used_ = pool_->used_pages();
  stat_pages_available_ = pool_->available_pages();
  stat_max_pages_ = pool_->max_pages();
}

std::unique_ptr<Sequence> EngineImpl::make_sequence(Incoming incoming) {
  auto seq = std::make_unique<Sequence>();
  seq->id = next_id_++;
  seq->state = std::move(incoming.state);
  seq->request = std::move(incoming.request);
  seq->submitted = incoming.submitted;
  const auto& prompt = seq->request.prompt_ids;
  seq->tokens = prompt;
  seq->prompt_len = static_cast<int64_t>(prompt.size());
  seq->prompt_positions = runner_->prompt_positions(prompt, seq->request.images, &seq->rope_delta);
  QVL_CHECK_EQ(seq->prompt_positions.size(), prompt.size() * 3);
  seq->images = find_image_spans(prompt, runner_->info().image_token_id);
  const SamplingParams& sp = seq->request.sampling;
  const uint64_t seed = sp.seed.has_value() ? *sp.seed : (uint64_t{entropy_()} << 32 | entropy_());
  seq->sampler = std::make_unique<Sampler>(sp, runner_->info().vocab_size, seed);
  seq->sampler->observe_prompt(prompt);
  seq->text = text_streams_(sp.stop);
  return seq;
}

void EngineImpl::ingest() {
  std::deque<Incoming> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(incoming_);
  }
  for (auto& in : batch) {
    auto state = in.state;
    try {
      scheduler_.enqueue(make_sequence(std::move(in)));
    } catch (const std::exception& e) {
      GenerationEvent ev;
      ev.kind = GenerationEvent::Kind::kFinished;
      ev.finish_reason = FinishReason::kError;
      ev.error = internal_error(std::string("preparing the request: ") + e.what());
      state->push(std::move(ev));
    }
  }
}

void EngineImpl::finish(std::unique_ptr<Sequence> seq, FinishReason reason, Status error, GenerationEvent ev) {
  const auto now = Clock::now();
  ev.kind = GenerationEvent::Kind::kFinished;
  ev.finish_reason = reason;
  ev.error = std::move(error);
  ev.usage.prompt_tokens = static_cast<int>(seq->prompt_len);
  ev.usage.completion_tokens = seq->generated;
  Timings& t = ev.timings;
  t.queue_ms = ms_between(seq->submitted, seq->was_scheduled ? seq->first_scheduled : now);
  t.vision_ms = seq->vision_ms;
  t.prefill_ms = seq->prefill_ms;
  if (seq->generated > 0) {
    t.ttft_ms = ms_between(seq->submitted, seq->first_token);
    t.decode_ms = ms_between(seq->first_token, seq->last_token);
    if (seq->generated > 1 && t.decode_ms > 0) t.decode_tokens_per_s = (seq->generated - 1) / (t.decode_ms / 1000.0);
  }
  if (reason == FinishReason::kError)
    log_warn("request " + seq->request.request_id + " failed: " + ev.error.to_string());
  publish_stats();  // the caller sees the freed pages once it sees the end of its request
  seq->state->push(std::move(ev));
}

void EngineImpl::advance(Sequence* seq, int32_t token, Clock::time_point now) {
  seq->tokens.push_back(token);
  if (seq->generated++ == 0) seq->first_token = now;
  seq->last_token = now;

  GenerationEvent ev;
  ev.token_ids.push_back(token);
  FinishReason reason = FinishReason::kNone;
  const auto& eos = options_.eos_token_ids;
  const bool is_eos = std::find(eos.begin(), eos.end(), token) != eos.end();
  if (is_eos && !seq->request.sampling.ignore_eos) {
    ev.text = seq->text->finish();
    reason = FinishReason::kStop;
  } else {
    TokenTextStream::Piece piece = seq->text->push(token);
    ev.text = std::move(piece.text);
    if (piece.stopped) {
      reason = FinishReason::kStop;
    } else if (seq->generated >= seq->request.sampling.max_tokens ||
               static_cast<int64_t>(seq->tokens.size()) >= options_.max_context) {
      ev.text += seq->text->finish();
      reason = FinishReason::kLength;
    }
  }
  if (reason == FinishReason::kNone) {
    seq->state->push(std::move(ev));
  } else {
    finish(scheduler_.remove(seq), reason, Status::ok(), std::move(ev));
  }
}

void EngineImpl::run_step(Scheduler::Plan& plan) {
  const auto t0 = Clock::now();
  const int vocab = runner_->info().vocab_size;
  const size_t rows = plan.input.logits_rows.size();
  QVL_CHECK_LE(rows * static_cast<size_t>(vocab), logits_.size());
  // Where the tokens are picked: every sampled row plain greedy -> the argmax where the logits
  // are; every row able to draw from its largest logits -> their keys; else the whole rows.
  bool greedy = options_.device_greedy && rows > 0;
  bool candidates = options_.device_top_k && rows > 0;
  size_t wanted = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (!plan.wants_logits[i]) continue;
    ++wanted;
    const Sampler& sampler = *plan.seqs[i]->sampler;
    if (!sampler.plain_greedy()) greedy = false;
    if (!sampler.can_sample_candidates()) candidates = false;
  }
  QVL_CHECK_EQ(wanted, rows) << "sampled sequences vs logits rows";
  if (greedy) candidates = false;
  std::vector<int32_t> greedy_tokens(greedy ? rows : 0);
  std::vector<uint64_t> keys(candidates ? rows * kSampleCandidates : 0);
  Status st;
  try {
    if (greedy)
      st = runner_->forward_greedy(plan.input, pool_->view(), greedy_tokens);
    else if (candidates)
      st = runner_->forward_top_k(plan.input, pool_->view(), keys);
    else
      st = runner_->forward(plan.input, pool_->view(),
                            std::span<float>(logits_.data(), rows * static_cast<size_t>(vocab)));
  } catch (const std::exception& e) {
    st = internal_error(std::string("forward: ") + e.what());
  }
  if (!st.is_ok()) {
    for (Sequence* seq : plan.seqs) finish(scheduler_.remove(seq), FinishReason::kError, st);
    return;
  }
  std::vector<bool> was_prefill(plan.seqs.size());
  for (size_t i = 0; i < plan.seqs.size(); ++i) was_prefill[i] = plan.seqs[i]->num_cached < plan.seqs[i]->prompt_len;
  scheduler_.commit(plan);
  const auto t1 = Clock::now();
  const double step_ms = ms_between(t0, t1);

  // Sample every row in parallel (each sampler is its sequence's own state), then stream and
  // retire in order on this thread.
  std::vector<Sequence*> sampled;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (was_prefill[i]) plan.seqs[i]->prefill_ms += step_ms;
    if (plan.wants_logits[i]) sampled.push_back(plan.seqs[i]);
  }
  const int n = static_cast<int>(sampled.size());
  std::vector<int32_t> tokens(sampled.size(), -1);
  std::vector<std::string> errors(sampled.size());
  // With candidates: the rows whose keys do not decide their token take their whole logits,
  // fetched here, on this thread (the runner is not shared with the sampling threads).
  std::vector<char> whole_row(sampled.size(), !greedy && !candidates);
  if (candidates) {
    for (int r = 0; r < n; ++r) {
      const auto row_keys =
          std::span<const uint64_t>(keys).subspan(static_cast<size_t>(r) * kSampleCandidates, kSampleCandidates);
      if (sampled[r]->sampler->candidates_decide(row_keys)) continue;
      whole_row[static_cast<size_t>(r)] = 1;
      try {
        Status fetched = runner_->logits_row(
            r, std::span<float>(logits_.data() + static_cast<size_t>(r) * vocab, static_cast<size_t>(vocab)));
        if (!fetched.is_ok()) errors[static_cast<size_t>(r)] = fetched.to_string();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = std::string("fetching the logits row: ") + e.what();
      }
    }
  }
  // Greedy steps only record their tokens: no threads for that.
  const int threads =
      greedy
          ? 1
          : std::max(1, std::min(n, options_.sampling_threads > 0 ? options_.sampling_threads : omp_get_max_threads()));
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
  for (int r = 0; r < n; ++r) {
    if (!errors[r].empty()) continue;
    try {
      if (greedy) {
        tokens[r] = greedy_tokens[static_cast<size_t>(r)];
        QVL_CHECK(tokens[r] >= 0 && tokens[r] < vocab) << "greedy token " << tokens[r] << " outside vocab " << vocab;
      } else if (whole_row[static_cast<size_t>(r)]) {
        std::span<float> logits(logits_.data() + static_cast<size_t>(r) * vocab, static_cast<size_t>(vocab));
        tokens[r] = sampled[r]->sampler->sample(logits);
      } else {
        tokens[r] = sampled[r]->sampler->sample_candidates(
            std::span<const uint64_t>(keys).subspan(static_cast<size_t>(r) * kSampleCandidates, kSampleCandidates));
      }
      sampled[r]->sampler->accept(tokens[r]);
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  }
  for (int r = 0; r < n; ++r) {
    if (!errors[r].empty()) {
      finish(scheduler_.remove(sampled[r]), FinishReason::kError, internal_error("sampling: " + errors[r]));
      continue;
    }
    try {
      advance(sampled[r], tokens[r], t1);
    } catch (const std::exception& e) {
      finish(scheduler_.remove(sampled[r]), FinishReason::kError,
             internal_error(std::string("streaming: ") + e.what()));
    }
  }
}

void EngineImpl::cancel_everything() {
  ingest();
  for (auto& seq : scheduler_.take_all())
    finish(std::move(seq), FinishReason::kCancelled, cancelled("the engine shut down before the request finished"));
}

void EngineImpl::loop() {
  while (true) {
    ingest();
    for (auto& seq : scheduler_.take_cancelled())
      finish(std::move(seq), FinishReason::kCancelled, cancelled("the request was cancelled"));
    bool stopping, past_deadline;
    Clock::time_point deadline;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping = stopping_;
      deadline = deadline_;
      past_deadline = stopping_ && Clock::now() >= deadline_;
    }
    if (past_deadline) cancel_everything();
    if (stopping) {
      std::lock_guard<std::mutex> lock(mu_);
      if (incoming_.empty() && scheduler_.num_running() == 0 && scheduler_.num_waiting() == 0) break;
    }
    Scheduler::Plan plan = scheduler_.schedule();
    for (auto& failure : plan.failed) finish(std::move(failure.seq), FinishReason::kError, failure.status);
    if (plan.empty()) {
      publish_stats();
      auto wait = std::chrono::milliseconds(200);
      if (stopping)
        wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()) +
                                  std::chrono::milliseconds(1));
      wakeup_->wait(std::max(wait, std::chrono::milliseconds(0)));
      continue;
    }
    publish_stats();  // what runs now, for stats() while the forward is busy
    run_step(plan);
    publish_stats();
  }
  publish_stats();
}

}  // namespace
}  // namespace engine_detail

Result<std::unique_ptr<Engine>> make_engine(std::unique_ptr<ModelRunner> runner, std::unique_ptr<KvPagePool> pool,
                                            TextStreamFactory text_streams, EngineOptions options) {
  QVL_CHECK(runner != nullptr && pool != nullptr && text_streams != nullptr);
  const ModelInfo& info = runner->info();
  if (options.max_running < 1)
    return invalid_argument("max running sequences " + std::to_string(options.max_running) + " must be >= 1");
  if (options.max_step_tokens < options.max_running)
    return invalid_argument("the step budget of " + std::to_string(options.max_step_tokens) +
                            " tokens must cover one decode token for each of the " +
                            std::to_string(options.max_running) + " running sequences");
  if (options.max_context < 2)
    return invalid_argument("context " + std::to_string(options.max_context) + " is too small");
  if (info.max_positions > 0 && options.max_context > info.max_positions)
    return invalid_argument("context " + std::to_string(options.max_context) + " exceeds the model's " +
                            std::to_string(info.max_positions) + " positions");
  if (options.max_queued < 0) return invalid_argument("max_queued must be >= 0");
  for (int32_t id : options.eos_token_ids)
    if (id < 0 || id >= info.vocab_size)
      return invalid_argument("eos token " + std::to_string(id) + " outside the vocabulary of " +
                              std::to_string(info.vocab_size));
  const KvLayout& a = info.kv_layout;
  const KvLayout& b = pool->layout();
  if (a.num_layers != b.num_layers || a.num_kv_heads != b.num_kv_heads || a.head_dim != b.head_dim ||
      a.dtype != b.dtype)
    return invalid_argument("the KV pool's layout does not match the model's");
  return std::unique_ptr<Engine>(
      new engine_detail::EngineImpl(std::move(runner), std::move(pool), std::move(text_streams), std::move(options)));
}

}  // namespace qvl
