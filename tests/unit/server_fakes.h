// Test doubles for the server's unit tests: an Engine whose output is a simple function of the
// prompt (so tests can compute the expected text and token ids themselves), and a PromptBuilder
// that "tokenizes" text as one id per byte and turns each image into a fixed run of pad ids.
// The acceptance tests run the real engine through the binary (tests/e2e); these only exercise
// the HTTP, schema, SSE and lifecycle layers.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/model_session.h"

namespace qvl::test {

// Generated token k (0-based) of a request is 1000 + (prompt length + k) % 97; its text is
// "<id> " (so the text of k tokens is predictable). Finishes with kStop after `eos_after`
// tokens when that is below max_tokens, else with kLength.
struct FakeEngineConfig {
  std::chrono::milliseconds step{1};  // time per generated token
  int eos_after = 1 << 30;
  int tokens_per_event = 1;
};

inline int32_t fake_token(size_t prompt_len, int k) {
  return 1000 + static_cast<int32_t>((prompt_len + k) % 97);
}
inline std::string fake_text(int32_t id) {
  return std::to_string(id) + " ";
}

class FakeEngine : public Engine {
 public:
  explicit FakeEngine(FakeEngineConfig config = {}) : config_(config) {}

  std::atomic<int> submitted{0};
  std::atomic<int> cancelled{0};
  std::atomic<int> live{0};  // streams not yet destroyed
  std::atomic<bool> shut{false};
  GenerationRequest last_request;
  std::mutex last_mu;

  class Stream : public RequestStream {
   public:
    Stream(FakeEngine* engine, GenerationRequest req) : engine_(engine), req_(std::move(req)) { engine_->live++; }
    ~Stream() override {
      if (!finished_) cancel();
      engine_->live--;
    }
    std::optional<GenerationEvent> next(std::chrono::milliseconds timeout) override {
      if (finished_) return std::nullopt;
      if (engine_->shut || cancelled_) return finish(FinishReason::kCancelled);
      // One event per step; a step longer than the timeout yields nothing this call.
      auto wait = std::min(engine_->config_.step, timeout);
      std::this_thread::sleep_for(wait);
      if (wait < engine_->config_.step) return std::nullopt;
      GenerationEvent ev;
      for (int i = 0; i < engine_->config_.tokens_per_event && !done(); ++i) {
        int32_t id = fake_token(req_.prompt_ids.size(), produced_++);
        ev.token_ids.push_back(id);
        ev.text += fake_text(id);
      }
      if (done()) {
        ev.kind = GenerationEvent::Kind::kFinished;
        ev.finish_reason =
            produced_ >= engine_->config_.eos_after && engine_->config_.eos_after < req_.sampling.max_tokens
                ? FinishReason::kStop
                : FinishReason::kLength;
        ev.usage = {static_cast<int>(req_.prompt_ids.size()), produced_};
        finished_ = true;
      }
      return ev;
    }
    void cancel() override {
      if (!cancelled_.exchange(true)) engine_->cancelled++;
    }

   private:
    bool done() const { return produced_ >= req_.sampling.max_tokens || produced_ >= engine_->config_.eos_after; }
    GenerationEvent finish(FinishReason r) {
      finished_ = true;
      GenerationEvent ev;
      ev.kind = GenerationEvent::Kind::kFinished;
      ev.finish_reason = r;
      ev.usage = {static_cast<int>(req_.prompt_ids.size()), produced_};
      return ev;
    }
    FakeEngine* engine_;
    GenerationRequest req_;
    int produced_ = 0;
    bool finished_ = false;
    std::atomic<bool> cancelled_{false};
  };

  Result<std::unique_ptr<RequestStream>> submit(GenerationRequest request) override {
    if (shut) return unavailable("engine is shutting down");
    if (static_cast<int>(request.prompt_ids.size()) + request.sampling.max_tokens > 100000)
      return out_of_range("fake engine: request can never fit");
    submitted++;
    {
      std::lock_guard<std::mutex> lock(last_mu);
      last_request = request;
    }
    return std::unique_ptr<RequestStream>(std::make_unique<Stream>(this, std::move(request)));
  }
  EngineStats stats() const override {
    EngineStats s;
    s.running = live.load();
    s.kv_pages_used = 3 * live.load();
    s.kv_pages_free = 100 - s.kv_pages_used;
    s.kv_page_tokens = 16;
    return s;
  }
  void shutdown(std::chrono::milliseconds) override { shut = true; }

 private:
  FakeEngineConfig config_;
};

// Text: one id per byte (the byte value). Each message is framed as [role id, ...bytes..., 10];
// an image becomes `image_pad_run` copies of id 151655 and one PreparedImage with grid
// 1×2×image_pad_run·2. Image bytes must start with "IMG" or the build fails with kDataLoss.
class FakePromptBuilder : public server::PromptBuilder {
 public:
  int image_pad_run = 4;

  Result<server::BuiltPrompt> build(const std::vector<server::ChatMessage>& messages,
                                    const std::vector<server::ImageBytes>& images) const override {
    server::BuiltPrompt out;
    for (const auto& m : messages) {
      out.prompt_ids.push_back(static_cast<int32_t>(m.role));
      for (const auto& p : m.parts) {
        if (p.kind == server::ChatPart::Kind::kText) {
          for (unsigned char c : p.text) out.prompt_ids.push_back(c);
        } else {
          const auto& img = images.at(static_cast<size_t>(p.image_index));
          if (img.bytes.rfind("IMG", 0) != 0) return data_loss(img.param + ": not an image (fake decoder)");
          for (int i = 0; i < image_pad_run; ++i) out.prompt_ids.push_back(151655);
          PreparedImage pi;
          pi.grid_h = 2;
          pi.grid_w = image_pad_run * 2;
          out.images.push_back(pi);
          out.image_tokens += image_pad_run;
        }
      }
      out.prompt_ids.push_back(10);
    }
    return out;
  }
};

}  // namespace qvl::test
