// The engine's public contract, used by `qvl run` and `qvl serve`: a request is a fully
// prepared prompt (token ids with image pad runs already expanded, preprocessed images) plus
// sampling parameters; the engine schedules it with continuous batching on one engine thread
// and streams events back through a RequestStream. Everything a client can get wrong is
// rejected before it reaches the engine (server/ and cli/ validate and prepare); the engine
// itself refuses only what the memory plan says can never fit, with the numbers.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace qvl {

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy
  float top_p = 1.0f;               // (0, 1]
  int top_k = 0;                    // 0 = off
  float min_p = 0.0f;               // [0, 1]
  float repetition_penalty = 1.0f;  // HF style: divide positive / multiply negative logits of seen tokens
  float presence_penalty = 0.0f;    // OpenAI style, on generated tokens
  float frequency_penalty = 0.0f;   // OpenAI style, on generated tokens
  std::optional<uint64_t> seed;     // same seed + same input -> same tokens
  int max_tokens = 256;
  std::vector<std::string> stop;  // stop strings (not included in the output)
  bool ignore_eos = false;
};

// One image after preprocessing, and its patch grid, in one of two forms: pixel_values
// [grid_t·grid_h·grid_w, patch_dim] float32 in the reference's row order, or (grid_t 1) the
// resized RGB8 image rgb [grid_h·patch, grid_w·patch, 3] that the model patchifies on its
// backend (image/image.h PreprocessOptions::rgb_output). Exactly one of the two is non-empty.
struct PreparedImage {
  std::vector<float> pixel_values;
  std::vector<uint8_t> rgb;
  int grid_t = 1, grid_h = 0, grid_w = 0;
  int64_t num_patches() const { return static_cast<int64_t>(grid_t) * grid_h * grid_w; }
};

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;    // chat-templated, image pads expanded (one run per image)
  std::vector<PreparedImage> images;  // in prompt order
  SamplingParams sampling;
  std::string request_id;  // for logs and metrics
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

struct Timings {
  double queue_ms = 0;    // submit -> first scheduled
  double vision_ms = 0;   // vision encoder
  double prefill_ms = 0;  // prompt processing, vision excluded
  double ttft_ms = 0;     // submit -> first token
  double decode_ms = 0;   // first token -> last token
  double decode_tokens_per_s = 0;
};

struct GenerationEvent {
  enum class Kind { kDelta, kFinished };
  Kind kind = Kind::kDelta;
  std::vector<int32_t> token_ids;                    // tokens completed since the last event
  std::string text;                                  // UTF-8 text that became final since the last event
  FinishReason finish_reason = FinishReason::kNone;  // kFinished only
  Status error;                                      // kFinished with kError only
  Usage usage;                                       // kFinished: totals
  Timings timings;                                   // kFinished
};

// The consumer side of one request. next() blocks until an event arrives or the timeout
// passes; after a kFinished event no more events come. Destroying the stream or calling
// cancel() cancels the request; the engine frees its resources within one step.
class RequestStream {
 public:
  virtual ~RequestStream() = default;
  virtual std::optional<GenerationEvent> next(std::chrono::milliseconds timeout) = 0;
  virtual void cancel() = 0;
};

struct EngineStats {
  int queued = 0;
  int running = 0;
  int64_t kv_pages_used = 0;
  int64_t kv_pages_free = 0;   // including pages the pool may still grow into
  int64_t kv_page_tokens = 0;  // tokens per page
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Queues a request. Refuses (kOutOfRange / kResourceExhausted, message with the numbers)
  // when the prompt plus max_tokens could never fit the context or the KV budget, and
  // (kUnavailable) after shutdown began.
  virtual Result<std::unique_ptr<RequestStream>> submit(GenerationRequest request) = 0;
  virtual EngineStats stats() const = 0;
  // Stops admitting; waits up to `deadline` for running requests, then cancels the rest.
  virtual void shutdown(std::chrono::milliseconds deadline) = 0;
};

}  // namespace qvl
