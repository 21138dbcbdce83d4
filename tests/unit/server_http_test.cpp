// The HTTP layer end to end in-process: a real ApiServer on an ephemeral loopback port with the
// fake engine and prompt builder (server_fakes.h), driven by httplib's client and raw sockets.
// Expected texts and token ids are computed here from the fakes' documented formulas.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "server/http_server.h"
#include "unit/server_fakes.h"

namespace qvl::server {
namespace {

using nlohmann::json;
using test::FakeEngine;
using test::FakeEngineConfig;
using test::FakePromptBuilder;

class ThrowingBuilder : public PromptBuilder {
 public:
  Result<BuiltPrompt> build(const std::vector<ChatMessage>&, const std::vector<ImageBytes>&) const override {
    QVL_CHECK(false) << "deliberate bug for the test";
    return internal_error("unreachable");
  }
};

struct Harness {
  std::shared_ptr<FakeEngine> engine;
  std::unique_ptr<ApiServer> server;
  std::unique_ptr<httplib::Client> client;

  explicit Harness(ServerOptions opt = {}, FakeEngineConfig cfg = {}, bool load = true, int context = 64,
                   std::shared_ptr<const PromptBuilder> builder = nullptr) {
    opt.host = "127.0.0.1";
    opt.port = 0;
    if (opt.served_model_name.empty()) opt.served_model_name = "tiny";
    engine = std::make_shared<FakeEngine>(cfg);
    server = std::make_unique<ApiServer>(opt);
    Status s = server->bind();
    QVL_CHECK(s.is_ok()) << s.to_string();
    server->start();
    if (load) set_model(context, builder);
    client = std::make_unique<httplib::Client>("127.0.0.1", server->port());
    client->set_read_timeout(10, 0);
  }
  void set_model(int context = 64, std::shared_ptr<const PromptBuilder> builder = nullptr) {
    ModelSession m;
    m.engine = engine;
    m.prompt_builder = builder ? builder : std::make_shared<FakePromptBuilder>();
    m.context_length = context;
    server->set_model(std::move(m));
  }
  httplib::Result post(const std::string& body, const httplib::Headers& headers = {}) {
    return client->Post("/v1/chat/completions", headers, body, "application/json");
  }
  ~Harness() {
    engine->shutdown(std::chrono::milliseconds(0));
    server->stop();
  }
};

// The fake builder's prompt for one user message "hi": [role 1, 'h', 'i', 10].
constexpr size_t kHiPromptLen = 4;
const std::string kHi = R"("messages":[{"role":"user","content":"hi"}])";

std::string expected_text(size_t prompt_len, int n) {
  std::string s;
  for (int k = 0; k < n; ++k) s += test::fake_text(test::fake_token(prompt_len, k));
  return s;
}

json error_of(const httplib::Result& r) {
  return json::parse(r->body)["error"];
}

bool wait_for(const std::function<bool()>& cond, int ms = 2000) {
  for (int i = 0; i < ms / 5; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

TEST(ApiServer, HealthIs503UntilTheModelLoads) {
  Harness h({}, {}, /*load=*/false);
  auto r = h.client->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(error_of(r)["message"], "the model is loading");
  r = h.post("{" + kHi + "}");
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(h.client->Get("/metrics")->body.find("qvl_model_loaded 0") != std::string::npos, true);
  h.set_model();
  r = h.client->Get("/health");
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["status"], "ok");
}

TEST(ApiServer, ASecondServerCannotTakeTheSamePort) {
  Harness h;
  ServerOptions opt;
  opt.host = "127.0.0.1";
  opt.port = h.server->port();
  ApiServer second(opt);
  Status s = second.bind();
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.message(),
            "cannot listen on 127.0.0.1:" + std::to_string(opt.port) + " (address in use or not available)");
}

TEST(ApiServer, ModelsList) {
  Harness h;
  auto r = h.client->Get("/v1/models");
  ASSERT_EQ(r->status, 200);
  auto j = json::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tiny");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["max_model_len"], 64);
  EXPECT_EQ(h.client->Get("/v1/models/tiny")->status, 200);
  r = h.client->Get("/v1/models/other");
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(error_of(r)["code"], "model_not_found");
  r = h.client->Get("/nope");
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(error_of(r)["message"], "no route for GET /nope");
}

TEST(ApiServer, NonStreamedCompletion) {
  Harness h;
  auto r = h.post("{\"model\":\"tiny\"," + kHi + ",\"max_tokens\":5,\"return_token_ids\":true}");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["id"], r->get_header_value("X-Request-Id"));
  EXPECT_EQ(j["choices"][0]["message"]["content"], expected_text(kHiPromptLen, 5));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["usage"]["total_tokens"], 9);
  EXPECT_EQ(j["prompt_token_ids"], json({1, 'h', 'i', 10}));
  EXPECT_EQ(j["choices"][0]["token_ids"][0], test::fake_token(kHiPromptLen, 0));
  // The engine got the request as parsed: sampling fields and the max_tokens.
  std::lock_guard<std::mutex> lock(h.engine->last_mu);
  EXPECT_EQ(h.engine->last_request.sampling.max_tokens, 5);
  EXPECT_EQ(h.engine->last_request.request_id, j["id"]);
}

TEST(ApiServer, DefaultMaxTokensIsCappedByTheContext) {
  ServerOptions opt;
  opt.default_max_tokens = 1000;
  Harness h(opt, {}, true, /*context=*/10);
  auto r = h.post("{" + kHi + "}");
  ASSERT_EQ(r->status, 200) << r->body;
  // 10 - 4 prompt tokens leaves 6 for the completion.
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 6);
  EXPECT_EQ(json::parse(r->body)["choices"][0]["finish_reason"], "length");
}

TEST(ApiServer, StopFinishReason) {
  FakeEngineConfig cfg;
  cfg.eos_after = 3;
  Harness h({}, cfg);
  auto r = h.post("{" + kHi + ",\"max_tokens\":8}");
  ASSERT_EQ(r->status, 200);
  auto j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["message"]["content"], expected_text(kHiPromptLen, 3));
}

std::vector<json> parse_sse(const std::string& body, bool* saw_done) {
  std::vector<json> events;
  *saw_done = false;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event";
    if (end == std::string::npos) break;
    std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    std::string data = ev.substr(6);
    EXPECT_FALSE(*saw_done) << "event after [DONE]";
    if (data == "[DONE]") {
      *saw_done = true;
      continue;
    }
    events.push_back(json::parse(data));
  }
  return events;
}

TEST(ApiServer, StreamedCompletionWithUsage) {
  FakeEngineConfig cfg;
  cfg.tokens_per_event = 2;
  Harness h({}, cfg);
  auto r = h.post("{" + kHi + ",\"max_tokens\":5,\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  bool done = false;
  auto events = parse_sse(r->body, &done);
  EXPECT_TRUE(done);
  // role, 3 content chunks (2+2+1 tokens), finish, usage.
  ASSERT_EQ(events.size(), 6u) << r->body;
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 1; i <= 3; ++i) {
    EXPECT_EQ(events[i]["object"], "chat.completion.chunk");
    EXPECT_EQ(events[i]["id"], events[0]["id"]);
    EXPECT_TRUE(events[i]["usage"].is_null());
    EXPECT_TRUE(events[i]["choices"][0]["finish_reason"].is_null());
    text += events[i]["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, expected_text(kHiPromptLen, 5));
  EXPECT_EQ(events[4]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(events[5]["choices"].empty());
  EXPECT_EQ(events[5]["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(events[5]["usage"]["completion_tokens"], 5);
}

TEST(ApiServer, ClientErrorsAre4xxWithMessages) {
  ServerOptions opt;
  opt.max_body_bytes = 2000;
  Harness h(opt, {}, true, /*context=*/20);
  auto r = h.post("{not json");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(error_of(r)["message"].get<std::string>().rfind("request body is not valid JSON", 0), 0u);
  r = h.post("{\"model\":\"gpt-4\"," + kHi + "}");
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(error_of(r)["code"], "model_not_found");
  EXPECT_EQ(error_of(r)["message"], "the model 'gpt-4' does not exist; this server serves 'tiny'");
  r = h.post("{" + kHi + ",\"max_tokens\":17}");  // 4 + 17 > 20
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(error_of(r)["code"], "context_length_exceeded");
  EXPECT_EQ(error_of(r)["message"],
            "this model's maximum context length is 20 tokens; the request needs 21 (4 in the messages, of which 0 "
            "image tokens, and 17 for the completion); shorten the messages or lower max_tokens");
  r = h.post(R"({"messages":[{"role":"user","content":"0123456789012345678"}]})");  // 21 prompt tokens
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(error_of(r)["message"],
            "this model's maximum context length is 20 tokens; the messages have 21 (of which 0 image tokens), "
            "leaving no room for a completion");
  // Image bytes that the (fake) decoder refuses: the message names the part.
  r = h.post(
      R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,Zm9v"}}]}]})");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(error_of(r)["message"], "messages[0].content[0].image_url: not an image (fake decoder)");
  EXPECT_EQ(error_of(r)["param"], "messages[0].content[0].image_url");
  r = h.post(
      R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,@@"}}]}]})");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(error_of(r)["message"], "messages[0].content[0].image_url: data URI: invalid base64: '@' at offset 0");
  EXPECT_EQ(error_of(r)["param"], "messages[0].content[0].image_url");
  r = h.post("{" + kHi + ",\"pad\":\"" + std::string(3000, 'x') + "\"}");
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(error_of(r)["message"], "request body of 3054 bytes exceeds the limit of 2000 bytes (--max-body-bytes)");
  // A good image (the fake decoder wants "IMG"): 4 pads.
  r = h.post(
      R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,SU1HMQ=="}}]}],"max_tokens":1})");
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["prompt_tokens"], 6);  // role + 4 pads + 10
  EXPECT_EQ(h.client->Get("/health")->status, 200);
}

TEST(ApiServer, ApiKeyAndCors) {
  ServerOptions opt;
  opt.api_key = "sekrit";
  opt.cors_origins = {"http://app.example"};
  Harness h(opt);
  auto r = h.post("{" + kHi + ",\"max_tokens\":1}");
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(error_of(r)["code"], "invalid_api_key");
  EXPECT_EQ(error_of(r)["message"], "missing API key: send the header 'Authorization: Bearer <key>'");
  r = h.post("{" + kHi + ",\"max_tokens\":1}", {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(error_of(r)["message"], "incorrect API key provided");
  EXPECT_EQ(h.client->Get("/v1/models", {{"Authorization", "Bearer sekrit!"}})->status, 401);
  r = h.post("{" + kHi + ",\"max_tokens\":1}", {{"Authorization", "Bearer sekrit"}, {"Origin", "http://app.example"}});
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  EXPECT_EQ(h.client->Get("/health")->status, 200);  // health and metrics need no key
  auto pre = h.client->Options("/v1/chat/completions", {{"Origin", "http://app.example"}});
  EXPECT_EQ(pre->status, 204);
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Headers"), "Authorization, Content-Type");
  pre = h.client->Options("/v1/chat/completions", {{"Origin", "http://evil.example"}});
  EXPECT_FALSE(pre->has_header("Access-Control-Allow-Origin"));
}

TEST(ApiServer, StreamingClientDisconnectCancels) {
  FakeEngineConfig cfg;
  cfg.step = std::chrono::milliseconds(10);
  Harness h({}, cfg, true, 100000);
  int chunks = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = "{" + kHi + ",\"max_tokens\":5000,\"stream\":true}";
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  auto r = h.client->send(req);
  EXPECT_FALSE(r);  // we aborted
  EXPECT_TRUE(wait_for([&] { return h.engine->cancelled.load() == 1 && h.engine->live.load() == 0; }))
      << "cancelled=" << h.engine->cancelled << " live=" << h.engine->live;
  EXPECT_EQ(h.server->in_flight(), 0);
}

TEST(ApiServer, NonStreamedClientDisconnectCancels) {
  FakeEngineConfig cfg;
  cfg.step = std::chrono::milliseconds(10);
  Harness h({}, cfg, true, 100000);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(h.server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  std::string body = "{" + kHi + ",\"max_tokens\":5000}";
  std::string msg =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(write(fd, msg.data(), msg.size()), static_cast<ssize_t>(msg.size()));
  ASSERT_TRUE(wait_for([&] { return h.engine->live.load() == 1; }));
  close(fd);
  EXPECT_TRUE(wait_for([&] { return h.engine->cancelled.load() == 1 && h.engine->live.load() == 0; }))
      << "cancelled=" << h.engine->cancelled << " live=" << h.engine->live;
  EXPECT_TRUE(wait_for([&] { return h.server->in_flight() == 0; }));
}

TEST(ApiServer, ConcurrencyLimitAndDrain) {
  ServerOptions opt;
  opt.max_concurrency = 1;
  FakeEngineConfig cfg;
  cfg.step = std::chrono::milliseconds(20);
  Harness h(opt, cfg);
  std::thread slow([&] {
    httplib::Client c("127.0.0.1", h.server->port());
    auto r = c.Post("/v1/chat/completions", "{" + kHi + ",\"max_tokens\":15}", "application/json");
    EXPECT_EQ(r->status, 200);
  });
  ASSERT_TRUE(wait_for([&] { return h.server->in_flight() == 1; }));
  auto r = h.post("{" + kHi + ",\"max_tokens\":1}");
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(error_of(r)["message"],
            "the server is at its limit of 1 concurrent requests (--max-concurrency); retry later");
  h.server->drain();
  r = h.post("{" + kHi + ",\"max_tokens\":1}");
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(h.client->Get("/health")->status, 503);
  slow.join();  // the admitted request still completes
}

TEST(ApiServer, CheckFailureIsA500ForThatRequestOnly) {
  Harness h({}, {}, true, 64, std::make_shared<ThrowingBuilder>());
  auto r = h.post("{" + kHi + ",\"max_tokens\":1}");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  EXPECT_EQ(error_of(r)["type"], "server_error");
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("deliberate bug for the test"), std::string::npos);
  h.set_model();  // the server is still serving
  EXPECT_EQ(h.post("{" + kHi + ",\"max_tokens\":1}")->status, 200);
  EXPECT_EQ(h.server->in_flight(), 0);
  // httplib counts a request (its logger) just after the response is written: wait for it.
  std::string metrics;
  EXPECT_TRUE(wait_for([&] {
    metrics = h.client->Get("/metrics")->body;
    return metrics.find("qvl_http_requests_total{endpoint=\"chat_completions\",status=\"200\"} 1") != std::string::npos;
  })) << metrics;
  EXPECT_NE(metrics.find("qvl_http_requests_total{endpoint=\"chat_completions\",status=\"500\"} 1"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("qvl_http_requests_total{endpoint=\"chat_completions\",status=\"200\"} 1"), std::string::npos);
  EXPECT_NE(metrics.find("qvl_generation_tokens_total 1\n"), std::string::npos);
}

}  // namespace
}  // namespace qvl::server
