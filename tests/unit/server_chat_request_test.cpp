// parse_chat_request: the typed result of valid bodies, and the status, param and message of
// invalid ones (one row per rule).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/chat_request.h"

namespace qvl::server {
namespace {

const char* kMsgs = R"("messages":[{"role":"user","content":"hi"}])";

ApiResult<ChatRequest> parse(const std::string& body, SamplingParams defaults = {}) {
  ChatRequestLimits limits;
  limits.max_images_per_request = 2;
  limits.max_stop_sequences = 3;
  return parse_chat_request(body, limits, defaults);
}

TEST(ChatRequest, ParsesStringAndArrayContentInOrder) {
  auto r = parse(R"({"model":"m","messages":[
      {"role":"system","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"A"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA=="}},
                                {"type":"text","text":"B"},{"type":"image_url","image_url":"file:///x.png"}]},
      {"role":"assistant","content":"ok"},
      {"role":"developer","content":[]}]})");
  ASSERT_TRUE(r.is_ok()) << r.error().message;
  const ChatRequest& c = r.value();
  EXPECT_EQ(c.model, "m");
  ASSERT_EQ(c.messages.size(), 4u);
  EXPECT_EQ(c.messages[0].role, Role::kSystem);
  ASSERT_EQ(c.messages[0].parts.size(), 1u);
  EXPECT_EQ(c.messages[0].parts[0].text, "be brief");
  EXPECT_TRUE(c.messages[0].string_content);
  EXPECT_FALSE(c.messages[1].string_content);
  const auto& parts = c.messages[1].parts;
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[0].kind, ChatPart::Kind::kText);
  EXPECT_EQ(parts[0].text, "A");
  EXPECT_EQ(parts[1].kind, ChatPart::Kind::kImage);
  EXPECT_EQ(parts[1].image_index, 0);
  EXPECT_EQ(parts[2].text, "B");
  EXPECT_EQ(parts[3].image_index, 1);
  ASSERT_EQ(c.images.size(), 2u);
  EXPECT_EQ(c.images[0].url, "data:image/png;base64,AA==");
  EXPECT_EQ(c.images[0].param, "messages[1].content[1].image_url");
  EXPECT_EQ(c.images[1].url, "file:///x.png");
  EXPECT_EQ(c.messages[2].role, Role::kAssistant);
  EXPECT_EQ(c.messages[3].role, Role::kSystem);  // developer is OpenAI's newer name for system
  EXPECT_TRUE(c.messages[3].parts.empty());
}

TEST(ChatRequest, SamplingFieldsAndDefaults) {
  SamplingParams defaults;
  defaults.temperature = 0.7f;
  defaults.top_p = 0.8f;
  defaults.top_k = 20;
  auto r = parse(std::string("{") + kMsgs + "}", defaults);
  ASSERT_TRUE(r.is_ok());
  EXPECT_FLOAT_EQ(r.value().sampling.temperature, 0.7f);  // from the model's generation_config
  EXPECT_FLOAT_EQ(r.value().sampling.top_p, 0.8f);
  EXPECT_EQ(r.value().sampling.top_k, 20);
  EXPECT_FALSE(r.value().max_tokens.has_value());
  EXPECT_FALSE(r.value().stream);

  r = parse(std::string("{") + kMsgs +
                R"(,"temperature":0,"top_p":0.5,"top_k":-1,"min_p":0.1,"presence_penalty":-2,"frequency_penalty":2,
                   "repetition_penalty":1.1,"seed":-1,"stop":["a","bc"],"max_tokens":7,"max_completion_tokens":9,
                   "n":1,"stream":true,"stream_options":{"include_usage":true},"ignore_eos":true,
                   "return_token_ids":true,"logprobs":false,"user":"x","tools":[],"response_format":{"type":"text"}})",
            defaults);
  ASSERT_TRUE(r.is_ok()) << r.error().message;
  const ChatRequest& c = r.value();
  EXPECT_FLOAT_EQ(c.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(c.sampling.top_p, 0.5f);
  EXPECT_EQ(c.sampling.top_k, 0);  // -1 turns top-k off
  EXPECT_FLOAT_EQ(c.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(c.sampling.presence_penalty, -2.0f);
  EXPECT_FLOAT_EQ(c.sampling.frequency_penalty, 2.0f);
  EXPECT_FLOAT_EQ(c.sampling.repetition_penalty, 1.1f);
  ASSERT_TRUE(c.sampling.seed.has_value());
  EXPECT_EQ(*c.sampling.seed, 0xFFFFFFFFFFFFFFFFull);  // -1's two's complement bits
  EXPECT_EQ(c.sampling.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(*c.max_tokens, 9);  // max_completion_tokens wins over the deprecated max_tokens
  EXPECT_TRUE(c.stream);
  EXPECT_TRUE(c.include_usage);
  EXPECT_TRUE(c.sampling.ignore_eos);
  EXPECT_TRUE(c.return_token_ids);

  r = parse(std::string("{") + kMsgs + R"(,"top_p":0,"stop":"END","max_tokens":16.0,"seed":18446744073709551615})");
  ASSERT_TRUE(r.is_ok()) << r.error().message;
  EXPECT_EQ(r.value().sampling.top_k, 1);  // top_p 0 keeps only the most likely token
  EXPECT_FLOAT_EQ(r.value().sampling.top_p, 1.0f);
  EXPECT_EQ(r.value().sampling.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(*r.value().max_tokens, 16);
  EXPECT_EQ(*r.value().sampling.seed, 18446744073709551615ull);

  r = parse(std::string("{") + kMsgs + R"(,"temperature":null,"stop":null,"max_tokens":null})", defaults);
  ASSERT_TRUE(r.is_ok());
  EXPECT_FLOAT_EQ(r.value().sampling.temperature, 0.7f);  // null means "not set"
  EXPECT_FALSE(r.value().max_tokens.has_value());
}

struct BadCase {
  std::string body;
  std::string param;
  std::string message;  // exact
};

TEST(ChatRequest, RejectsBadInputWithParamAndMessage) {
  const std::string m = kMsgs;
  const std::vector<BadCase> cases = {
      {"[1,2]", "", "request body must be a JSON object, got array"},
      {"{}", "messages", "messages is required"},
      {R"({"messages":"hi"})", "messages", "messages must be an array, got string"},
      {R"({"messages":[]})", "messages", "messages must contain at least one message"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role", "messages[0].role is required"},
      {R"({"messages":[{"role":"robot","content":"x"}]})", "messages[0].role",
       "messages[0].role must be one of system, developer, user, assistant, got 'robot'"},
      {R"({"messages":[{"role":"tool","content":"x"}]})", "messages[0].role",
       "messages[0].role 'tool' is not supported (this server has no tool calling)"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content", "messages[0].content is required"},
      {R"({"messages":[{"role":"assistant","content":null}]})", "messages[0].content",
       "messages[0].content is required"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content",
       "messages[0].content must be a string or an array of content parts, got integer"},
      {R"({"messages":[{"role":"user","content":[{"type":"audio","x":1}]}]})", "messages[0].content[0].type",
       "messages[0].content[0].type must be one of text, image_url, got 'audio'"},
      {R"({"messages":[{"role":"user","content":[{"type":"input_audio"}]}]})", "messages[0].content[0].type",
       "messages[0].content[0].type 'input_audio' is not supported by this server (supported: text, image_url)"},
      {R"({"messages":[{"role":"user","content":[{"text":"x"}]}]})", "messages[0].content[0].type",
       "messages[0].content[0].type is required"},
      {R"({"messages":[{"role":"user","content":[{"type":"text","text":3}]}]})", "messages[0].content[0].text",
       "messages[0].content[0].text must be a string, got integer"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":""}}]}]})",
       "messages[0].content[0].image_url.url", "messages[0].content[0].image_url.url is empty"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"a","detail":"max"}}]}]})",
       "messages[0].content[0].image_url.detail",
       "messages[0].content[0].image_url.detail must be one of auto, low, high, got 'max'"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":"a"},{"type":"image_url","image_url":"b"},{"type":"image_url","image_url":"c"}]}]})",
       "messages", "request has 3 images; the limit is 2 (--max-images-per-request)"},
      {"{" + m + R"(,"model":7})", "model", "model must be a string, got integer"},
      {"{" + m + R"(,"max_tokens":-5})", "max_tokens", "max_tokens must be at least 1, got -5"},
      {"{" + m + R"(,"max_tokens":0})", "max_tokens", "max_tokens must be at least 1, got 0"},
      {"{" + m + R"(,"max_tokens":2.5})", "max_tokens", "max_tokens must be an integer, got 2.5"},
      {"{" + m + R"(,"max_tokens":"10"})", "max_tokens", "max_tokens must be an integer, got string"},
      {"{" + m + R"(,"max_completion_tokens":-1})", "max_completion_tokens",
       "max_completion_tokens must be at least 1, got -1"},
      {"{" + m + R"(,"temperature":2.5})", "temperature", "temperature must be in [0, 2], got 2.5"},
      {"{" + m + R"(,"temperature":-0.1})", "temperature", "temperature must be in [0, 2], got -0.1"},
      {"{" + m + R"(,"temperature":"hot"})", "temperature", "temperature must be a number, got string"},
      {"{" + m + R"(,"top_p":1.5})", "top_p", "top_p must be in [0, 1], got 1.5"},
      {"{" + m + R"(,"top_k":-2})", "top_k", "top_k must be at least -1, got -2"},
      {"{" + m + R"(,"min_p":2})", "min_p", "min_p must be in [0, 1], got 2"},
      {"{" + m + R"(,"presence_penalty":3})", "presence_penalty", "presence_penalty must be in [-2, 2], got 3"},
      {"{" + m + R"(,"frequency_penalty":-2.5})", "frequency_penalty",
       "frequency_penalty must be in [-2, 2], got -2.5"},
      {"{" + m + R"(,"repetition_penalty":0})", "repetition_penalty",
       "repetition_penalty must be greater than 0, got 0"},
      {"{" + m + R"(,"seed":1.5})", "seed", "seed must be an integer, got 1.5"},
      {"{" + m + R"(,"n":2})", "n", "n must be 1 (this server returns one choice per request), got 2"},
      {"{" + m + R"(,"n":0})", "n", "n must be at least 1, got 0"},
      {"{" + m + R"(,"stop":5})", "stop", "stop must be a string or an array of strings, got integer"},
      {"{" + m + R"(,"stop":["a",1]})", "stop[1]", "stop[1] must be a string, got integer"},
      {"{" + m + R"(,"stop":["a","b","c","d"]})", "stop", "stop has 4 sequences; the limit is 3"},
      {"{" + m + R"(,"stop":[""]})", "stop", "stop sequences must not be empty (stop[0])"},
      {"{" + m + R"(,"stream":"yes"})", "stream", "stream must be a boolean, got string"},
      {"{" + m + R"(,"stream_options":{"include_usage":true}})", "stream_options",
       "stream_options is only allowed when stream is true"},
      {"{" + m + R"(,"stream":true,"stream_options":{"include_usage":1}})", "stream_options.include_usage",
       "stream_options.include_usage must be a boolean, got integer"},
      {"{" + m + R"(,"logprobs":true})", "logprobs", "logprobs is not supported by this server"},
      {"{" + m + R"(,"tools":[{"type":"function"}]})", "tools", "tools are not supported by this server"},
      {"{" + m + R"(,"response_format":{"type":"json_object"}})", "response_format",
       "response_format: only {\"type\": \"text\"} is supported by this server"},
  };
  for (const auto& c : cases) {
    auto r = parse(c.body);
    ASSERT_FALSE(r.is_ok()) << c.body;
    EXPECT_EQ(r.error().http_status, 400) << c.body;
    EXPECT_EQ(r.error().type, "invalid_request_error") << c.body;
    EXPECT_EQ(r.error().param, c.param) << c.body;
    EXPECT_EQ(r.error().message, c.message) << c.body;
  }
}

TEST(ChatRequest, InvalidJsonNamesThePosition) {
  auto r = parse(R"({"messages": [)");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.error().http_status, 400);
  EXPECT_EQ(r.error().message.rfind("request body is not valid JSON: parse error at line 1, column 15", 0), 0u)
      << r.error().message;
}

TEST(ChatRequest, NumberOverflowIsA400NotAnException) {
  // Found by the fuzzer: nlohmann throws out_of_range for 1e999 even when asked not to throw.
  auto r = parse(R"({"messages":[{"role":"user","content":"x"}],"temperature":1e999})");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.error().http_status, 400);
  EXPECT_EQ(r.error().message, "request body is not valid JSON: number overflow parsing '1e999'");
}

TEST(ApiErrorJson, HasOpenAIShape) {
  ApiError e = bad_request("temperature must be in [0, 2], got 3", "temperature");
  auto j = nlohmann::json::parse(e.to_json());
  EXPECT_EQ(j["error"]["message"], "temperature must be in [0, 2], got 3");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_TRUE(j["error"]["code"].is_null());
  ApiError internal = api_error_from_status(internal_error("boom"), "x");
  EXPECT_EQ(internal.http_status, 500);
  EXPECT_EQ(internal.type, "server_error");
  EXPECT_TRUE(nlohmann::json::parse(internal.to_json())["error"]["param"].is_null());
  EXPECT_EQ(api_error_from_status(data_loss("truncated JPEG")).http_status, 400);
  EXPECT_EQ(api_error_from_status(unavailable("loading")).http_status, 503);
}

}  // namespace
}  // namespace qvl::server
