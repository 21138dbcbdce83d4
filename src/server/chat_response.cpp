#include "server/chat_response.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

namespace qvl::server {
namespace {

using nlohmann::json;

constexpr const char* kFingerprint = "qvl-0.1.0";

// Engine text is valid UTF-8 by contract; replacing rather than throwing keeps one bad byte from
// turning a whole response into a 500.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json chunk_base(const ResponseMeta& meta) {
  json j = {{"id", meta.id},
            {"object", "chat.completion.chunk"},
            {"created", meta.created},
            {"model", meta.model},
            {"system_fingerprint", kFingerprint}};
  return j;
}

std::string frame(json chunk, const ResponseMeta& meta) {
  if (meta.include_usage && !chunk.contains("usage")) chunk["usage"] = nullptr;
  return "data: " + dump(chunk) + "\n\n";
}

json choice(json delta, const char* finish_reason) {
  json c = {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (finish_reason && *finish_reason) c["finish_reason"] = finish_reason;
  return c;
}

}  // namespace

const char* openai_finish_reason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    default:
      return "";
  }
}

std::string completion_json(const ResponseMeta& meta, const std::string& text, FinishReason finish, const Usage& usage,
                            const std::vector<int32_t>& prompt_ids, const std::vector<int32_t>& token_ids) {
  json message = {{"role", "assistant"}, {"content", text}, {"refusal", nullptr}};
  json c = {{"index", 0}, {"message", message}, {"logprobs", nullptr}, {"finish_reason", openai_finish_reason(finish)}};
  if (meta.return_token_ids) c["token_ids"] = token_ids;
  json j = {{"id", meta.id},
            {"object", "chat.completion"},
            {"created", meta.created},
            {"model", meta.model},
            {"system_fingerprint", kFingerprint},
            {"choices", json::array({c})},
            {"usage", usage_json(usage)}};
  if (meta.return_token_ids) j["prompt_token_ids"] = prompt_ids;
  return dump(j);
}

std::string sse_role_chunk(const ResponseMeta& meta, const std::vector<int32_t>& prompt_ids) {
  json j = chunk_base(meta);
  j["choices"] = json::array({choice({{"role", "assistant"}, {"content", ""}}, nullptr)});
  if (meta.return_token_ids) j["prompt_token_ids"] = prompt_ids;
  return frame(std::move(j), meta);
}

std::string sse_content_chunk(const ResponseMeta& meta, const std::string& text,
                              const std::vector<int32_t>& token_ids) {
  json j = chunk_base(meta);
  json c = choice({{"content", text}}, nullptr);
  if (meta.return_token_ids) c["token_ids"] = token_ids;
  j["choices"] = json::array({c});
  return frame(std::move(j), meta);
}

std::string sse_finish_chunk(const ResponseMeta& meta, FinishReason finish) {
  json j = chunk_base(meta);
  j["choices"] = json::array({choice(json::object(), openai_finish_reason(finish))});
  return frame(std::move(j), meta);
}

std::string sse_usage_chunk(const ResponseMeta& meta, const Usage& usage) {
  json j = chunk_base(meta);
  j["choices"] = json::array();
  j["usage"] = usage_json(usage);
  return frame(std::move(j), meta);
}

std::string sse_error_event(const std::string& error_json) {
  return "data: " + error_json + "\n\n";
}

std::string new_completion_id() {
  // Unique within and across processes: a random 64-bit base per process plus a counter,
  // mixed so that consecutive ids do not look sequential.
  static const uint64_t base = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
           static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }();
  static std::atomic<uint64_t> counter{0};
  const uint64_t n = ++counter;
  uint64_t x = base + 0x9E3779B97F4A7C15ull * n;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  char buf[40];
  std::snprintf(buf, sizeof buf, "chatcmpl-%016llx%08llx", static_cast<unsigned long long>(x),
                static_cast<unsigned long long>(n & 0xFFFFFFFFull));
  return buf;
}

}  // namespace qvl::server
