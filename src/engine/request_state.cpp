#include "engine/request_state.h"

namespace qvl::engine_detail {

void Wakeup::notify() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = true;
  }
  cv_.notify_one();
}

void Wakeup::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return pending_; });
  pending_ = false;
}

void RequestState::push(GenerationEvent event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

std::optional<GenerationEvent> RequestState::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (finish_delivered_) return std::nullopt;
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  GenerationEvent merged = std::move(events_.front());
  events_.pop_front();
  while (!events_.empty()) {
    GenerationEvent& e = events_.front();
    merged.token_ids.insert(merged.token_ids.end(), e.token_ids.begin(), e.token_ids.end());
    merged.text += e.text;
    merged.kind = e.kind;
    merged.finish_reason = e.finish_reason;
    merged.error = std::move(e.error);
    merged.usage = e.usage;
    merged.timings = e.timings;
    events_.pop_front();
  }
  if (merged.kind == GenerationEvent::Kind::kFinished) finish_delivered_ = true;
  return merged;
}

void RequestState::cancel() {
  if (!cancelled_.exchange(true, std::memory_order_acq_rel)) wakeup_->notify();
}

}  // namespace qvl::engine_detail
