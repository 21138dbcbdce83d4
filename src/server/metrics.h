// Server metrics in the Prometheus text exposition format (version 0.0.4), served at /metrics.
// Counters and histograms are updated by the HTTP workers as requests progress; gauges that
// describe the engine (queue depth, running sequences, KV pages) are read from EngineStats at
// scrape time, so they can never drift from the engine's own numbers. All members are safe to
// call from any thread.
//
// Exposed series (all prefixed qvl_):
//   http_requests_total{endpoint,status}     counter, every answered HTTP request
//   prompt_tokens_total, generation_tokens_total     counters, finished chat requests
//   request_finished_total{finish_reason}    counter: stop, length, cancelled, error
//   time_to_first_token_seconds              histogram, request arrival -> first token
//   inter_token_latency_seconds              histogram, between consecutive generated tokens
//   e2e_request_latency_seconds              histogram, request arrival -> last token
//   requests_in_flight, num_requests_waiting, num_requests_running, kv_pages_used,
//   kv_pages_free, kv_page_tokens, model_loaded      gauges
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace qvl::server {

// A cumulative histogram with fixed upper bounds (seconds), as Prometheus expects.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends the _bucket/_sum/_count lines for `name`.
  void render(const std::string& name, std::string* out) const;
  uint64_t count() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = +Inf
  double sum_ = 0;
  uint64_t total_ = 0;
};

class Metrics {
 public:
  Metrics();

  void count_http_request(const std::string& endpoint, int status);
  void observe_ttft(double seconds) { ttft_.observe(seconds); }
  void observe_inter_token(double seconds) { itl_.observe(seconds); }
  void observe_e2e(double seconds) { e2e_.observe(seconds); }
  void count_finished(const std::string& finish_reason, int prompt_tokens, int completion_tokens);

  // The exposition text. `engine` is empty while the model loads; `in_flight` is the server's
  // count of chat requests being handled (validating, queued, running or streaming).
  std::string render(const std::optional<EngineStats>& engine, int in_flight = 0) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> http_requests_;
  std::map<std::string, uint64_t> finished_;
  std::atomic<uint64_t> prompt_tokens_{0};
  std::atomic<uint64_t> generation_tokens_{0};
  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
};

}  // namespace qvl::server
