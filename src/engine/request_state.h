// The meeting point of one request's producer (the engine thread) and its consumer (the caller
// holding the RequestStream): a queue of events, a cancelled flag, and the engine's wakeup so
// that a cancel is noticed at once even when the engine is idle. Internal to engine/.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "engine/engine.h"

namespace qvl::engine_detail {

// Wakes the engine thread: set by submit, cancel and shutdown; the thread sleeps on it when it
// has nothing to run.
class Wakeup {
 public:
  void notify();
  // Waits until notified (or `timeout`), then clears the notification.
  void wait(std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false;
};

class RequestState {
 public:
  explicit RequestState(std::shared_ptr<Wakeup> wakeup) : wakeup_(std::move(wakeup)) {}

  // Producer side (engine thread).
  void push(GenerationEvent event);
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  // Consumer side. Pending events are merged into one: their token ids and text concatenated,
  // the rest taken from the last (so a slow consumer gets one larger delta, not a backlog).
  std::optional<GenerationEvent> next(std::chrono::milliseconds timeout);
  void cancel();

 private:
  std::shared_ptr<Wakeup> wakeup_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationEvent> events_;
  bool finish_delivered_ = false;
};

// The RequestStream handed to the caller; destroying it cancels the request.
class StreamHandle final : public RequestStream {
 public:
  explicit StreamHandle(std::shared_ptr<RequestState> state) : state_(std::move(state)) {}
  ~StreamHandle() override { state_->cancel(); }
  std::optional<GenerationEvent> next(std::chrono::milliseconds timeout) override { return state_->next(timeout); }
  void cancel() override { state_->cancel(); }

 private:
  std::shared_ptr<RequestState> state_;
};

}  // namespace qvl::engine_detail
