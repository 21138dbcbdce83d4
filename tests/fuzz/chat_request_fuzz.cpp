// libFuzzer target: parse_chat_request on arbitrary bodies, then every image reference through
// the media policy with file:// and http(s) off (data: URIs are decoded). Checks what the rest
// of the server relies on: a parsed request is in range (image indexes, limits, sampling
// ranges, max_tokens); a refusal is a 4xx with a message whose JSON body parses; base64
// decoding inverts encoding.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "server/chat_request.h"
#include "server/media.h"

namespace {

std::string base64_encode(const std::string& in) {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += {a[v >> 18], a[(v >> 12) & 63], a[(v >> 6) & 63], a[v & 63]};
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += {a[v >> 18], a[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += {a[v >> 18], a[(v >> 12) & 63], a[(v >> 6) & 63], '='};
  }
  return out;
}

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qvl::server;
  const std::string body(reinterpret_cast<const char*>(data), size);

  auto decoded = base64_decode(base64_encode(body));
  check(decoded.is_ok() && decoded.value() == body);

  ChatRequestLimits limits;
  limits.max_images_per_request = 4;
  auto r = parse_chat_request(body, limits, qvl::SamplingParams{});
  if (!r.is_ok()) {
    const ApiError& e = r.error();
    check(e.http_status == 400 && !e.message.empty());
    auto j = nlohmann::json::parse(e.to_json(), nullptr, false);
    check(!j.is_discarded() && j["error"]["message"].is_string());
    return 0;
  }
  const ChatRequest& c = r.value();
  check(!c.messages.empty());
  check(static_cast<int>(c.images.size()) <= limits.max_images_per_request);
  size_t image_parts = 0;
  for (const auto& m : c.messages)
    for (const auto& p : m.parts)
      if (p.kind == ChatPart::Kind::kImage) {
        check(p.image_index == static_cast<int>(image_parts));
        ++image_parts;
      }
  check(image_parts == c.images.size());
  const qvl::SamplingParams& s = c.sampling;
  check(s.temperature >= 0 && s.temperature <= 2);
  check(s.top_p > 0 && s.top_p <= 1);
  check(s.top_k >= 0 && s.min_p >= 0 && s.min_p <= 1 && s.repetition_penalty > 0);
  check(s.presence_penalty >= -2 && s.presence_penalty <= 2 && s.frequency_penalty >= -2 && s.frequency_penalty <= 2);
  check(!c.max_tokens || *c.max_tokens >= 1);
  for (const auto& stop : s.stop) check(!stop.empty());
  MediaPolicy policy;  // file:// and http(s) refused: no I/O from the fuzzer
  policy.max_image_bytes = 1 << 16;
  for (const auto& ref : c.images) {
    auto bytes = load_image_bytes(ref.url, policy);
    check(bytes.is_ok() ? static_cast<int64_t>(bytes->size()) <= policy.max_image_bytes
                        : !bytes.status().message().empty());
  }
  return 0;
}
