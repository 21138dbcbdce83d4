#include "server/metrics.h"

#include <algorithm>
#include <cstdio>

#include "core/check.h"

namespace qvl::server {
namespace {

// Prometheus floats: integers without a fraction, others with enough digits to round-trip.
std::string prom_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void header(std::string* out, const std::string& name, const char* type, const char* help) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

// Bucket bounds in seconds. TTFT spans a tiny model on a CPU (milliseconds) to a large image on
// a slow card (tens of seconds); inter-token latency is milliseconds to a second.
std::vector<double> ttft_bounds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> itl_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
          0.075, 0.1,    0.15,  0.2,  0.3,   0.4,  0.5,   0.75, 1.0,  2.5};
}
std::vector<double> e2e_bounds() {
  return {0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0};
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)) {
  QVL_CHECK(std::is_sorted(bounds_.begin(), bounds_.end())) << "histogram bounds must ascend";
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::observe(double value) {
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();  // first bound >= value
  std::lock_guard<std::mutex> lock(mu_);
  counts_[i] += 1;
  sum_ += value;
  total_ += 1;
}

uint64_t Histogram::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

void Histogram::render(const std::string& name, std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    *out += name + "_bucket{le=\"" + prom_number(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  *out += name + "_bucket{le=\"+Inf\"} " + std::to_string(total_) + "\n";
  *out += name + "_sum " + prom_number(sum_) + "\n";
  *out += name + "_count " + std::to_string(total_) + "\n";
}

Metrics::Metrics() : ttft_(ttft_bounds()), itl_(itl_bounds()), e2e_(e2e_bounds()) {}

void Metrics::count_http_request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  http_requests_[{endpoint, status}] += 1;
}

void Metrics::count_finished(const std::string& finish_reason, int prompt_tokens, int completion_tokens) {
  prompt_tokens_ += static_cast<uint64_t>(std::max(prompt_tokens, 0));
  generation_tokens_ += static_cast<uint64_t>(std::max(completion_tokens, 0));
  std::lock_guard<std::mutex> lock(mu_);
  finished_[finish_reason] += 1;
}

std::string Metrics::render(const std::optional<EngineStats>& engine, int in_flight) const {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    header(&out, "qvl_http_requests_total", "counter", "HTTP requests answered, by endpoint and status code.");
    for (const auto& [key, n] : http_requests_)
      out += "qvl_http_requests_total{endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"} " +
             std::to_string(n) + "\n";
    header(&out, "qvl_request_finished_total", "counter", "Chat requests finished, by finish reason.");
    for (const auto& [reason, n] : finished_)
      out += "qvl_request_finished_total{finish_reason=\"" + reason + "\"} " + std::to_string(n) + "\n";
  }
  header(&out, "qvl_prompt_tokens_total", "counter", "Prompt tokens of finished chat requests.");
  out += "qvl_prompt_tokens_total " + std::to_string(prompt_tokens_.load()) + "\n";
  header(&out, "qvl_generation_tokens_total", "counter", "Generated tokens of finished chat requests.");
  out += "qvl_generation_tokens_total " + std::to_string(generation_tokens_.load()) + "\n";
  header(&out, "qvl_time_to_first_token_seconds", "histogram", "Request arrival to first generated token.");
  ttft_.render("qvl_time_to_first_token_seconds", &out);
  header(&out, "qvl_inter_token_latency_seconds", "histogram", "Time between consecutive generated tokens.");
  itl_.render("qvl_inter_token_latency_seconds", &out);
  header(&out, "qvl_e2e_request_latency_seconds", "histogram", "Request arrival to last generated token.");
  e2e_.render("qvl_e2e_request_latency_seconds", &out);

  const EngineStats s = engine.value_or(EngineStats{});
  auto gauge = [&](const char* name, const char* help, int64_t v) {
    header(&out, name, "gauge", help);
    out += std::string(name) + " " + std::to_string(v) + "\n";
  };
  gauge("qvl_model_loaded", "1 once the model is loaded and requests are served.", engine ? 1 : 0);
  gauge("qvl_requests_in_flight", "Chat requests the server is handling (validating, queued, running, streaming).",
        in_flight);
  gauge("qvl_num_requests_waiting", "Requests queued in the engine, not yet running.", s.queued);
  gauge("qvl_num_requests_running", "Sequences in the engine's running batch.", s.running);
  gauge("qvl_kv_pages_used", "KV cache pages held by sequences.", s.kv_pages_used);
  gauge("qvl_kv_pages_free", "KV cache pages still available (including growth up to the budget).", s.kv_pages_free);
  gauge("qvl_kv_page_tokens", "Tokens per KV cache page.", s.kv_page_tokens);
  return out;
}

}  // namespace qvl::server
