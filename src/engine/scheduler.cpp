#include "engine/scheduler.h"

#include <algorithm>

#include "core/check.h"
#include "core/log.h"

namespace qvl::engine_detail {

std::vector<ImageSpan> find_image_spans(std::span<const int32_t> prompt, int32_t image_token_id) {
  std::vector<ImageSpan> spans;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] != image_token_id) continue;
    size_t j = i;
    while (j < prompt.size() && prompt[j] == image_token_id) ++j;
    spans.push_back({static_cast<int64_t>(i), static_cast<int64_t>(j - i)});
    i = j - 1;
  }
  return spans;
}

int32_t Sequence::position(int64_t index, int axis) const {
  if (index < prompt_len) return prompt_positions[static_cast<size_t>(index * 3 + axis)];
  return static_cast<int32_t>(index + rope_delta);
}

Scheduler::Scheduler(KvPagePool& pool, ModelRunner& runner, const EngineOptions& options)
    : pool_(pool), runner_(runner), options_(options) {}

void Scheduler::enqueue(std::unique_ptr<Sequence> seq) {
  waiting_.push_back(std::move(seq));
}

int64_t Scheduler::pages_to_finish_prefill(const Sequence& seq) const {
  return std::max<int64_t>(0, pool_.pages_for(static_cast<int64_t>(seq.tokens.size()) + 1) - seq.pages.num_pages());
}

void Scheduler::release(Sequence& seq) {
  pool_.release(seq.pages);
  seq.features.reset();
  seq.live_image = -1;
  if (image_owner_ == &seq) image_owner_ = nullptr;
}

void Scheduler::preempt(size_t running_index) {
  std::unique_ptr<Sequence> seq = std::move(running_[running_index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(running_index));
  release(*seq);
  log_debug("preempted request '" + seq->request.request_id + "' (" + std::to_string(seq->tokens.size()) +
            " tokens) to free KV pages; it will be recomputed");
  seq->num_cached = 0;
  ++seq->preemptions;
  waiting_.push_front(std::move(seq));
}

std::unique_ptr<Sequence> Scheduler::remove(Sequence* seq) {
  std::unique_ptr<Sequence> out;
  auto match = [seq](const std::unique_ptr<Sequence>& s) { return s.get() == seq; };
  if (auto it = std::find_if(running_.begin(), running_.end(), match); it != running_.end()) {
    out = std::move(*it);
    running_.erase(it);
  } else if (auto wit = std::find_if(waiting_.begin(), waiting_.end(), match); wit != waiting_.end()) {
    out = std::move(*wit);
    waiting_.erase(wit);
  }
  QVL_CHECK(out != nullptr) << "sequence " << seq->id << " is not scheduled";
  release(*out);
  return out;
}

std::vector<std::unique_ptr<Sequence>> Scheduler::take_cancelled() {
  std::vector<Sequence*> doomed;
  for (auto& s : running_)
    if (s->state->cancelled()) doomed.push_back(s.get());
  for (auto& s : waiting_)
    if (s->state->cancelled()) doomed.push_back(s.get());
  std::vector<std::unique_ptr<Sequence>> out;
  for (Sequence* s : doomed) out.push_back(remove(s));
  return out;
}

std::vector<std::unique_ptr<Sequence>> Scheduler::take_all() {
  std::vector<Sequence*> all;
  for (auto& s : running_) all.push_back(s.get());
  for (auto& s : waiting_) all.push_back(s.get());
  std::vector<std::unique_ptr<Sequence>> out;
  for (Sequence* s : all) out.push_back(remove(s));
  return out;
}

Result<int64_t> Scheduler::prefill_chunk(Sequence& seq, int64_t budget) {
  const int64_t a = seq.num_cached;
  int64_t b = std::min<int64_t>(static_cast<int64_t>(seq.tokens.size()), a + budget);
  size_t idx = 0;
  while (idx < seq.images.size() && seq.images[idx].end() <= a) ++idx;
  if (idx < seq.images.size() && seq.images[idx].start < b) {
    const ImageSpan& span = seq.images[idx];
    if (!(image_owner_ == &seq && seq.live_image == static_cast<int>(idx))) {
      if (image_owner_ != nullptr) {
        // Another sequence's image holds the features memory: feed the text before ours.
        return std::max<int64_t>(0, span.start - a);
      }
      const auto t0 = Clock::now();
      auto features = runner_.encode_image(seq.request.images[idx]);
      if (!features.is_ok()) return features.status().with_context("image " + std::to_string(idx + 1));
      if ((*features)->num_tokens() != span.length)
        return internal_error("image " + std::to_string(idx + 1) + ": the vision encoder made " +
                              std::to_string((*features)->num_tokens()) + " tokens for a run of " +
                              std::to_string(span.length) + " pad tokens");
      seq.features = std::move(features).value();
      seq.live_image = static_cast<int>(idx);
      image_owner_ = &seq;
      seq.vision_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    }
    // One image per chunk: the next image waits for the next step.
    if (idx + 1 < seq.images.size() && seq.images[idx + 1].start < b) b = seq.images[idx + 1].start;
  }
  return b - a;
}

void Scheduler::add_to_plan(Plan& plan, Sequence& seq, int64_t n) {
  StepInput& in = plan.input;
  const int64_t row0 = static_cast<int64_t>(in.token_ids.size());
  const int ps = pool_.page_size();
  const auto& pages = seq.pages.pages();
  if (in.query_start.empty()) in.query_start.push_back(0);
  for (int64_t k = seq.num_cached; k < seq.num_cached + n; ++k) {
    in.token_ids.push_back(seq.tokens[static_cast<size_t>(k)]);
    for (int axis = 0; axis < 3; ++axis) in.positions.push_back(seq.position(k, axis));
    in.slots.push_back(pages[static_cast<size_t>(k / ps)] * ps + static_cast<int32_t>(k % ps));
  }
  const int64_t context = seq.num_cached + n;
  in.query_start.push_back(static_cast<int32_t>(row0 + n));
  in.context_len.push_back(static_cast<int32_t>(context));
  in.max_context = std::max<int>(in.max_context, static_cast<int>(context));
  const bool logits = context == static_cast<int64_t>(seq.tokens.size());
  if (logits) in.logits_rows.push_back(static_cast<int32_t>(row0 + n - 1));
  if (seq.live_image >= 0) {
    const ImageSpan& span = seq.images[static_cast<size_t>(seq.live_image)];
    const int64_t lo = std::max(seq.num_cached, span.start), hi = std::min(context, span.end());
    if (lo < hi) in.images.push_back({seq.features.get(), lo - span.start, row0 + lo - seq.num_cached, hi - lo});
  }
  plan.seqs.push_back(&seq);
  plan.counts.push_back(n);
  plan.wants_logits.push_back(logits);
}

Scheduler::Plan Scheduler::schedule() {
  Plan plan;
  int64_t budget = options_.max_step_tokens;

  // 1. One token for every decoding sequence, oldest first; a missing page preempts the youngest.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence& seq = *running_[i];
    if (seq.prefilling()) continue;
    bool fits = pool_.reserve(seq.pages, seq.num_cached + 1);
    while (!fits && running_.size() - 1 > i) {
      preempt(running_.size() - 1);
      fits = pool_.reserve(seq.pages, seq.num_cached + 1);
    }
    if (!fits) {
      if (running_.size() == 1) {
        // Alone and still no page: the pool shrank under it (the device refused to grow).
        const int64_t tokens = seq.num_cached + 1;
        plan.failed.push_back(
            {remove(&seq), resource_exhausted("the KV cache cannot hold " + std::to_string(tokens) + " tokens: only " +
                                              std::to_string(pool_.max_pages()) + " pages of " +
                                              std::to_string(pool_.page_size()) + " tokens")});
      } else {
        preempt(i);  // it is the youngest itself
      }
      break;
    }
    add_to_plan(plan, seq, 1);
    --budget;
  }

  // 2. Prefill chunks of admitted sequences, oldest first.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence& seq = *running_[i];
    if (!seq.prefilling() || std::find(plan.seqs.begin(), plan.seqs.end(), &seq) != plan.seqs.end()) continue;
    auto n = prefill_chunk(seq, budget);
    if (!n.is_ok()) {
      plan.failed.push_back({remove(&seq), n.status()});
      --i;
      continue;
    }
    if (*n == 0 || !pool_.reserve(seq.pages, seq.num_cached + *n)) continue;
    add_to_plan(plan, seq, *n);
    budget -= *n;
  }

  // 3. Admit from the head of the queue while the batch, the budget and the pages allow. Pages
  // still owed to prefilling sequences are not available to newcomers.
  int64_t available = pool_.available_pages();
  for (const auto& s : running_)
    if (s->prefilling()) available -= pages_to_finish_prefill(*s);
  while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_running && budget > 0) {
    Sequence& seq = *waiting_.front();
    const int64_t need = pages_to_finish_prefill(seq);
    if (need > available) {
      if (running_.empty() && need > pool_.max_pages()) {
        const int64_t tokens = static_cast<int64_t>(seq.tokens.size()) + 1;
        plan.failed.push_back(
            {remove(&seq), resource_exhausted("the KV cache cannot hold " + std::to_string(tokens) + " tokens: only " +
                                              std::to_string(pool_.max_pages()) + " pages of " +
                                              std::to_string(pool_.page_size()) + " tokens")});
        continue;
      }
      break;  // wait for pages; nobody overtakes the head
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    available -= need;
    if (!seq.was_scheduled) {
      seq.was_scheduled = true;
      seq.first_scheduled = Clock::now();
    }
    auto n = prefill_chunk(seq, budget);
    if (!n.is_ok()) {
      plan.failed.push_back({remove(&seq), n.status()});
      continue;
    }
    if (*n == 0 || !pool_.reserve(seq.pages, seq.num_cached + *n)) continue;
    add_to_plan(plan, seq, *n);
    budget -= *n;
  }

  // The page table, as narrow as this step allows.
  StepInput& in = plan.input;
  int64_t width = 1;
  for (Sequence* s : plan.seqs) width = std::max(width, s->pages.num_pages());
  in.max_pages_per_seq = static_cast<int>(width);
  in.page_table.assign(plan.seqs.size() * static_cast<size_t>(width), 0);
  for (size_t b = 0; b < plan.seqs.size(); ++b) {
    const auto& pages = plan.seqs[b]->pages.pages();
    std::copy(pages.begin(), pages.end(), in.page_table.begin() + static_cast<std::ptrdiff_t>(b * width));
  }
  return plan;
}

void Scheduler::commit(const Plan& plan) {
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    Sequence& seq = *plan.seqs[i];
    seq.num_cached += plan.counts[i];
    QVL_CHECK_LE(seq.num_cached, static_cast<int64_t>(seq.tokens.size()));
    if (seq.live_image >= 0 && seq.num_cached >= seq.images[static_cast<size_t>(seq.live_image)].end()) {
      seq.features.reset();
      seq.live_image = -1;
      if (image_owner_ == &seq) image_owner_ = nullptr;
    }
  }
}

}  // namespace qvl::engine_detail
