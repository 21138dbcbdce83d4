#include "server/chat_request.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace qvl::server {
namespace {

using nlohmann::json;

const char* json_type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "array";
    case json::value_t::object:
      return "object";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "integer";
    case json::value_t::number_float:
      return "number";
    default:
      return "value";
  }
}

std::string fmt_number(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  json j = v;
  return j.dump();
}

ApiError wrong_type(const std::string& param, const char* expected, const json& got) {
  return bad_request(param + " must be " + expected + ", got " + json_type_name(got), param);
}

// Reads optional fields of the top-level object; each getter returns an ApiError on a bad type
// or range. A JSON null counts as absent, as in OpenAI's schema (every optional field is
// nullable).
class Fields {
 public:
  explicit Fields(const json& obj) : obj_(obj) {}

  const json* find(const char* key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  // A number within [lo, hi] (bounds inclusive unless lo_open / hi_open).
  std::optional<ApiError> number(const char* key, double lo, double hi, bool lo_open, bool hi_open,
                                 std::optional<double>* out) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) return wrong_type(key, "a number", *v);
    double d = v->get<double>();
    bool below = lo_open ? !(d > lo) : !(d >= lo);
    bool above = hi_open ? !(d < hi) : !(d <= hi);
    if (below || above) {
      std::string range =
          std::string(lo_open ? "(" : "[") + fmt_number(lo) + ", " + fmt_number(hi) + (hi_open ? ")" : "]");
      if (hi == std::numeric_limits<double>::infinity())
        range = std::string(lo_open ? "greater than " : "at least ") + fmt_number(lo);
      return bad_request(std::string(key) + " must be " + (range[0] == '(' || range[0] == '[' ? "in " : "") + range +
                             ", got " + fmt_number(d),
                         key);
    }
    *out = d;
    return std::nullopt;
  }

  // An integer (an integral float such as 16.0 is accepted) within [lo, hi].
  std::optional<ApiError> integer(const char* key, int64_t lo, int64_t hi, std::optional<int64_t>* out) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    int64_t value = 0;
    if (v->is_number_unsigned()) {
      uint64_t u = v->get<uint64_t>();
      value = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                             : static_cast<int64_t>(u);
    } else if (v->is_number_integer()) {
      value = v->get<int64_t>();
    } else if (v->is_number_float()) {
      double d = v->get<double>();
      if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15)
        return bad_request(std::string(key) + " must be an integer, got " + fmt_number(d), key);
      value = static_cast<int64_t>(d);
    } else {
      return wrong_type(key, "an integer", *v);
    }
    if (value < lo)
      return bad_request(
          std::string(key) + " must be at least " + std::to_string(lo) + ", got " + std::to_string(value), key);
    if (value > hi)
      return bad_request(std::string(key) + " must be at most " + std::to_string(hi) + ", got " + std::to_string(value),
                         key);
    *out = value;
    return std::nullopt;
  }

  std::optional<ApiError> boolean(const char* key, bool* out) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) return wrong_type(key, "a boolean", *v);
    *out = v->get<bool>();
    return std::nullopt;
  }

 private:
  const json& obj_;
};

#define QVL_API_TRY(expr)                                 \
  do {                                                    \
    if (auto qvl_api_err_ = (expr)) return *qvl_api_err_; \
  } while (0)

// Parses one content part of messages[m].content[p].
std::optional<ApiError> parse_part(const json& part, const std::string& param, ChatRequest* req, ChatMessage* msg) {
  if (!part.is_object()) return wrong_type(param, "an object", part);
  auto type_it = part.find("type");
  if (type_it == part.end()) return bad_request(param + ".type is required", param + ".type");
  if (!type_it->is_string()) return wrong_type(param + ".type", "a string", *type_it);
  const std::string type = type_it->get<std::string>();
  if (type == "text") {
    auto t = part.find("text");
    if (t == part.end()) return bad_request(param + ".text is required for a text part", param + ".text");
    if (!t->is_string()) return wrong_type(param + ".text", "a string", *t);
    msg->parts.push_back({ChatPart::Kind::kText, t->get<std::string>(), -1});
    return std::nullopt;
  }
  if (type == "image_url") {
    auto iu = part.find("image_url");
    if (iu == part.end())
      return bad_request(param + ".image_url is required for an image_url part", param + ".image_url");
    std::string url;
    if (iu->is_string()) {  // vLLM also accepts the bare string form
      url = iu->get<std::string>();
    } else if (iu->is_object()) {
      auto u = iu->find("url");
      if (u == iu->end()) return bad_request(param + ".image_url.url is required", param + ".image_url.url");
      if (!u->is_string()) return wrong_type(param + ".image_url.url", "a string", *u);
      url = u->get<std::string>();
      auto d = iu->find("detail");
      if (d != iu->end() && !d->is_null()) {
        if (!d->is_string()) return wrong_type(param + ".image_url.detail", "a string", *d);
        const std::string detail = d->get<std::string>();
        if (detail != "auto" && detail != "low" && detail != "high")
          return bad_request(param + ".image_url.detail must be one of auto, low, high, got '" + detail + "'",
                             param + ".image_url.detail");
      }
    } else {
      return wrong_type(param + ".image_url", "an object", *iu);
    }
    if (url.empty()) return bad_request(param + ".image_url.url is empty", param + ".image_url.url");
    msg->parts.push_back({ChatPart::Kind::kImage, "", static_cast<int>(req->images.size())});
    req->images.push_back({std::move(url), param + ".image_url"});
    return std::nullopt;
  }
  if (type == "input_audio" || type == "file" || type == "video_url" || type == "audio_url" || type == "refusal")
    return bad_request(param + ".type '" + type + "' is not supported by this server (supported: text, image_url)",
                       param + ".type");
  return bad_request(param + ".type must be one of text, image_url, got '" + type + "'", param + ".type");
}

std::optional<ApiError> parse_messages(const json& root, ChatRequest* req) {
  auto it = root.find("messages");
  if (it == root.end() || it->is_null()) return bad_request("messages is required", "messages");
  if (!it->is_array()) return wrong_type("messages", "an array", *it);
  if (it->empty()) return bad_request("messages must contain at least one message", "messages");
  for (size_t m = 0; m < it->size(); ++m) {
    const json& jm = (*it)[m];
    const std::string param = "messages[" + std::to_string(m) + "]";
    if (!jm.is_object()) return wrong_type(param, "an object", jm);
    auto role_it = jm.find("role");
    if (role_it == jm.end()) return bad_request(param + ".role is required", param + ".role");
    if (!role_it->is_string()) return wrong_type(param + ".role", "a string", *role_it);
    const std::string role = role_it->get<std::string>();
    ChatMessage msg;
    if (role == "system" || role == "developer") {
      msg.role = Role::kSystem;  // OpenAI's newer name for the system role
    } else if (role == "user") {
      msg.role = Role::kUser;
    } else if (role == "assistant") {
      msg.role = Role::kAssistant;
    } else if (role == "tool" || role == "function") {
      return bad_request(param + ".role '" + role + "' is not supported (this server has no tool calling)",
                         param + ".role");
    } else {
      return bad_request(param + ".role must be one of system, developer, user, assistant, got '" + role + "'",
                         param + ".role");
    }
    auto tc = jm.find("tool_calls");
    if (tc != jm.end() && !tc->is_null() && !(tc->is_array() && tc->empty()))
      return bad_request(param + ".tool_calls is not supported (this server has no tool calling)",
                         param + ".tool_calls");
    auto content = jm.find("content");
    const std::string cparam = param + ".content";
    if (content == jm.end() || content->is_null()) {
      // OpenAI allows a null content only for assistant messages that carry tool calls, which
      // this server does not take.
      return bad_request(cparam + " is required", cparam);
    } else if (content->is_string()) {
      msg.string_content = true;
      msg.parts.push_back({ChatPart::Kind::kText, content->get<std::string>(), -1});
    } else if (content->is_array()) {
      for (size_t p = 0; p < content->size(); ++p)
        QVL_API_TRY(parse_part((*content)[p], cparam + "[" + std::to_string(p) + "]", req, &msg));
    } else {
      return wrong_type(cparam, "a string or an array of content parts", *content);
    }
    auto name = jm.find("name");
    if (name != jm.end() && !name->is_null() && !name->is_string())
      return wrong_type(param + ".name", "a string", *name);
    req->messages.push_back(std::move(msg));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_stop(const json& root, const ChatRequestLimits& limits, ChatRequest* req) {
  auto it = root.find("stop");
  if (it == root.end() || it->is_null()) return std::nullopt;
  std::vector<std::string> stops;
  if (it->is_string()) {
    stops.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    for (size_t i = 0; i < it->size(); ++i) {
      const json& s = (*it)[i];
      if (!s.is_string()) return wrong_type("stop[" + std::to_string(i) + "]", "a string", s);
      stops.push_back(s.get<std::string>());
    }
  } else {
    return wrong_type("stop", "a string or an array of strings", *it);
  }
  if (static_cast<int>(stops.size()) > limits.max_stop_sequences)
    return bad_request("stop has " + std::to_string(stops.size()) + " sequences; the limit is " +
                           std::to_string(limits.max_stop_sequences),
                       "stop");
  for (size_t i = 0; i < stops.size(); ++i)
    if (stops[i].empty())
      return bad_request("stop sequences must not be empty (stop[" + std::to_string(i) + "])", "stop");
  req->sampling.stop = std::move(stops);
  return std::nullopt;
}

// Fields that are valid OpenAI parameters but ask for something qvl does not do: refuse them
// rather than silently ignore them, unless they carry their "off" value.
std::optional<ApiError> refuse_unsupported(const json& root) {
  auto present = [&](const char* k) -> const json* {
    auto it = root.find(k);
    return (it == root.end() || it->is_null()) ? nullptr : &*it;
  };
  if (const json* v = present("logprobs"); v && !(v->is_boolean() && !v->get<bool>()))
    return bad_request("logprobs is not supported by this server", "logprobs");
  if (present("top_logprobs")) return bad_request("top_logprobs is not supported by this server", "top_logprobs");
  if (const json* v = present("tools"); v && !(v->is_array() && v->empty()))
    return bad_request("tools are not supported by this server", "tools");
  if (const json* v = present("tool_choice"); v && !(v->is_string() && v->get<std::string>() == "none"))
    return bad_request("tool_choice is not supported by this server", "tool_choice");
  if (present("functions")) return bad_request("functions are not supported by this server", "functions");
  if (const json* v = present("logit_bias"); v && !(v->is_object() && v->empty()))
    return bad_request("logit_bias is not supported by this server", "logit_bias");
  if (const json* v = present("response_format")) {
    auto t = v->is_object() ? v->find("type") : v->end();
    if (!v->is_object() || t == v->end() || !t->is_string() || t->get<std::string>() != "text")
      return bad_request("response_format: only {\"type\": \"text\"} is supported by this server", "response_format");
  }
  if (const json* v = present("modalities")) {
    if (!v->is_array()) return wrong_type("modalities", "an array", *v);
    for (const json& m : *v)
      if (!m.is_string() || m.get<std::string>() != "text")
        return bad_request("modalities: only \"text\" output is supported by this server", "modalities");
  }
  return std::nullopt;
}

}  // namespace

const char* role_name(Role role) {
  switch (role) {
    case Role::kSystem:
      return "system";
    case Role::kUser:
      return "user";
    case Role::kAssistant:
      return "assistant";
  }
  return "user";
}

ApiResult<ChatRequest> parse_chat_request(const std::string& body, const ChatRequestLimits& limits,
                                          const SamplingParams& defaults) {
  json root;
  try {
    root = json::parse(body);
  } catch (const json::exception& e) {
    // parse_error names the position; out_of_range (a number too large for a double) is thrown
    // even by the non-throwing overload, so both are caught here.
    std::string why = e.what();
    for (const char* marker : {"parse error at ", "number overflow"}) {
      auto pos = why.find(marker);
      if (pos != std::string::npos) {
        why = why.substr(pos);
        break;
      }
    }
    return bad_request("request body is not valid JSON: " + why);
  }
  if (!root.is_object())
    return bad_request(std::string("request body must be a JSON object, got ") + json_type_name(root));

  ChatRequest req;
  req.sampling = defaults;
  req.sampling.stop.clear();
  if (auto it = root.find("model"); it != root.end() && !it->is_null()) {
    if (!it->is_string()) return wrong_type("model", "a string", *it);
    req.model = it->get<std::string>();
  }
  QVL_API_TRY(parse_messages(root, &req));
  if (static_cast<int>(req.images.size()) > limits.max_images_per_request)
    return bad_request("request has " + std::to_string(req.images.size()) + " images; the limit is " +
                           std::to_string(limits.max_images_per_request) + " (--max-images-per-request)",
                       "messages", "too_many_images");

  Fields f(root);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  std::optional<int64_t> max_tokens, max_completion_tokens, n, top_k, seed;
  std::optional<double> temperature, top_p, min_p, presence, frequency, repetition;
  QVL_API_TRY(f.integer("max_tokens", 1, kMaxInt, &max_tokens));
  QVL_API_TRY(f.integer("max_completion_tokens", 1, kMaxInt, &max_completion_tokens));
  QVL_API_TRY(f.integer("n", 1, kMaxInt, &n));
  if (n && *n != 1)
    return bad_request("n must be 1 (this server returns one choice per request), got " + std::to_string(*n), "n");
  QVL_API_TRY(f.number("temperature", 0, 2, false, false, &temperature));
  QVL_API_TRY(f.number("top_p", 0, 1, false, false, &top_p));
  QVL_API_TRY(f.integer("top_k", -1, kMaxInt, &top_k));
  QVL_API_TRY(f.number("min_p", 0, 1, false, false, &min_p));
  QVL_API_TRY(f.number("presence_penalty", -2, 2, false, false, &presence));
  QVL_API_TRY(f.number("frequency_penalty", -2, 2, false, false, &frequency));
  QVL_API_TRY(f.number("repetition_penalty", 0, kInf, true, false, &repetition));
  if (const json* v = f.find("seed")) {
    // OpenAI's seed is any 64-bit integer; keep its two's-complement bits.
    if (v->is_number_unsigned()) {
      seed = static_cast<int64_t>(v->get<uint64_t>());
    } else {
      QVL_API_TRY(f.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &seed));
    }
  }
  QVL_API_TRY(parse_stop(root, limits, &req));
  QVL_API_TRY(f.boolean("stream", &req.stream));
  QVL_API_TRY(f.boolean("ignore_eos", &req.sampling.ignore_eos));
  QVL_API_TRY(f.boolean("return_token_ids", &req.return_token_ids));
  if (const json* so = f.find("stream_options")) {
    if (!so->is_object()) return wrong_type("stream_options", "an object", *so);
    if (!req.stream) return bad_request("stream_options is only allowed when stream is true", "stream_options");
    Fields sf(*so);
    if (auto e = sf.boolean("include_usage", &req.include_usage)) {
      ApiError err = *e;
      err.param = "stream_options.include_usage";
      err.message = "stream_options." + err.message;
      return err;
    }
  }
  QVL_API_TRY(refuse_unsupported(root));

  if (max_completion_tokens)
    req.max_tokens = static_cast<int>(*max_completion_tokens);
  else if (max_tokens)
    req.max_tokens = static_cast<int>(*max_tokens);
  SamplingParams& s = req.sampling;
  if (temperature) s.temperature = static_cast<float>(*temperature);
  if (top_k) s.top_k = *top_k > 0 ? static_cast<int>(*top_k) : 0;  // -1 and 0 both mean "off" (vLLM)
  if (top_p) {
    // top_p = 0 keeps only the most likely token: the same as top_k = 1.
    if (*top_p == 0) {
      s.top_p = 1.0f;
      s.top_k = 1;
    } else {
      s.top_p = static_cast<float>(*top_p);
    }
  }
  if (min_p) s.min_p = static_cast<float>(*min_p);
  if (presence) s.presence_penalty = static_cast<float>(*presence);
  if (frequency) s.frequency_penalty = static_cast<float>(*frequency);
  if (repetition) s.repetition_penalty = static_cast<float>(*repetition);
  if (seed) s.seed = static_cast<uint64_t>(*seed);
  return req;
}

}  // namespace qvl::server
