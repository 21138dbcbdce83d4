// Prometheus exposition: histogram buckets are cumulative with le bounds inclusive, counters
// and gauges carry the values put in; and the chat response / chunk shapes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "server/chat_response.h"
#include "server/metrics.h"

namespace qvl::server {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

TEST(Histogram, CumulativeBucketsSumAndCount) {
  Histogram h({0.1, 0.5, 1.0});
  for (double v : {0.05, 0.1, 0.3, 0.7, 2.0}) h.observe(v);
  std::string out;
  h.render("x", &out);
  // 0.05 and 0.1 are <= 0.1 (le is inclusive); 0.3 adds to <= 0.5; 0.7 to <= 1; 2.0 only to +Inf.
  EXPECT_TRUE(has_line(out, "x_bucket{le=\"0.10000000000000001\"} 2")) << out;
  EXPECT_TRUE(has_line(out, "x_bucket{le=\"0.5\"} 3")) << out;
  EXPECT_TRUE(has_line(out, "x_bucket{le=\"1\"} 4")) << out;
  EXPECT_TRUE(has_line(out, "x_bucket{le=\"+Inf\"} 5")) << out;
  EXPECT_TRUE(has_line(out, "x_sum 3.1499999999999999")) << out;  // 0.05+0.1+0.3+0.7+2.0
  EXPECT_TRUE(has_line(out, "x_count 5")) << out;
}

TEST(Metrics, RendersCountersAndEngineGauges) {
  Metrics m;
  m.count_http_request("chat_completions", 200);
  m.count_http_request("chat_completions", 200);
  m.count_http_request("chat_completions", 400);
  m.count_finished("stop", 10, 3);
  m.count_finished("length", 5, 7);
  m.observe_ttft(0.002);
  EngineStats s;
  s.queued = 2;
  s.running = 3;
  s.kv_pages_used = 40;
  s.kv_pages_free = 60;
  s.kv_page_tokens = 16;
  std::string out = m.render(s, 5);
  EXPECT_TRUE(has_line(out, "qvl_http_requests_total{endpoint=\"chat_completions\",status=\"200\"} 2")) << out;
  EXPECT_TRUE(has_line(out, "qvl_http_requests_total{endpoint=\"chat_completions\",status=\"400\"} 1")) << out;
  EXPECT_TRUE(has_line(out, "qvl_request_finished_total{finish_reason=\"stop\"} 1")) << out;
  EXPECT_TRUE(has_line(out, "qvl_prompt_tokens_total 15")) << out;
  EXPECT_TRUE(has_line(out, "qvl_generation_tokens_total 10")) << out;
  EXPECT_TRUE(has_line(out, "qvl_time_to_first_token_seconds_count 1")) << out;
  EXPECT_TRUE(has_line(out, "qvl_num_requests_waiting 2")) << out;
  EXPECT_TRUE(has_line(out, "qvl_num_requests_running 3")) << out;
  EXPECT_TRUE(has_line(out, "qvl_kv_pages_used 40")) << out;
  EXPECT_TRUE(has_line(out, "qvl_kv_pages_free 60")) << out;
  EXPECT_TRUE(has_line(out, "qvl_model_loaded 1")) << out;
  EXPECT_TRUE(has_line(out, "qvl_requests_in_flight 5")) << out;
  EXPECT_TRUE(has_line(m.render(std::nullopt), "qvl_model_loaded 0"));
  // Every series has its TYPE line, and every line is a comment or "name{labels} value".
  std::set<std::string> typed;
  size_t pos = 0;
  while (pos < out.size()) {
    size_t end = out.find('\n', pos);
    std::string line = out.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind("# TYPE ", 0) == 0) typed.insert(line.substr(7, line.find(' ', 7) - 7));
    if (line[0] == '#') continue;
    std::string name = line.substr(0, line.find_first_of("{ "));
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (!typed.count(name) && name.size() > strlen(suffix) && name.ends_with(suffix))
        name.resize(name.size() - strlen(suffix));
    EXPECT_TRUE(typed.count(name)) << line;
  }
}

TEST(ChatResponse, CompletionAndChunkShapes) {
  ResponseMeta meta{"chatcmpl-1", 1700000000, "tiny", true, true};
  auto c = nlohmann::json::parse(completion_json(meta, "hi", FinishReason::kStop, {5, 2}, {1, 2}, {7, 8}));
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["id"], "chatcmpl-1");
  EXPECT_EQ(c["created"], 1700000000);
  EXPECT_EQ(c["model"], "tiny");
  EXPECT_EQ(c["choices"][0]["index"], 0);
  EXPECT_EQ(c["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(c["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(c["choices"][0]["token_ids"], nlohmann::json({7, 8}));
  EXPECT_EQ(c["prompt_token_ids"], nlohmann::json({1, 2}));
  EXPECT_EQ(c["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(c["usage"]["completion_tokens"], 2);
  EXPECT_EQ(c["usage"]["total_tokens"], 7);

  auto parse_event = [](const std::string& ev) {
    EXPECT_EQ(ev.rfind("data: ", 0), 0u);
    EXPECT_EQ(ev.substr(ev.size() - 2), "\n\n");
    return nlohmann::json::parse(ev.substr(6, ev.size() - 8));
  };
  auto role = parse_event(sse_role_chunk(meta, {1, 2}));
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(role["usage"].is_null());  // present and null with include_usage
  auto content = parse_event(sse_content_chunk(meta, "a\"b\n", {9}));
  EXPECT_EQ(content["choices"][0]["delta"]["content"], "a\"b\n");
  EXPECT_FALSE(content["choices"][0]["delta"].contains("role"));
  auto fin = parse_event(sse_finish_chunk(meta, FinishReason::kLength));
  EXPECT_TRUE(fin["choices"][0]["delta"].empty());
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "length");
  auto usage = parse_event(sse_usage_chunk(meta, {3, 4}));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);
  meta.include_usage = false;
  EXPECT_FALSE(parse_event(sse_content_chunk(meta, "x", {})).contains("usage"));
  EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");
  // Invalid UTF-8 from a broken detokenizer is replaced, not turned into an exception.
  auto bad = nlohmann::json::parse(completion_json(meta, "a\xff", FinishReason::kStop, {}, {}, {}));
  EXPECT_EQ(bad["choices"][0]["message"]["content"], "a\xEF\xBF\xBD");
}

TEST(ChatResponse, CompletionIdsAreUnique) {
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) ids.insert(new_completion_id());
  EXPECT_EQ(ids.size(), 1000u);
  EXPECT_EQ(ids.begin()->rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(ids.begin()->size(), 9u + 24u);
}

}  // namespace
}  // namespace qvl::server
