// The OpenAI chat-completions request, parsed and validated into plain typed data.
// parse_chat_request() is the single gate between untrusted JSON and the rest of qvl: after it
// returns a ChatRequest, every field has the right type and lies in its documented range, the
// image references are counted against the per-request limit, and unsupported features (n > 1,
// logprobs, tools, ...) have been refused with a 400 that names the field. Nothing is fetched or
// decoded here (media.h does that), so parsing is cheap and never blocks.
//
// Field names, types, defaults and ranges follow OpenAI's API reference for
// POST /v1/chat/completions; qvl's extensions (top_k, min_p, repetition_penalty, ignore_eos,
// return_token_ids) follow vLLM's names and meanings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/api_error.h"

namespace qvl::server {

enum class Role { kSystem, kUser, kAssistant };
const char* role_name(Role role);

// One part of a message's content, in the order the client sent it.
struct ChatPart {
  enum class Kind { kText, kImage };
  Kind kind = Kind::kText;
  std::string text;      // kText
  int image_index = -1;  // kImage: index into ChatRequest::images
};

struct ChatMessage {
  Role role = Role::kUser;
  std::vector<ChatPart> parts;  // a string content becomes one text part
  bool string_content = false;  // content was a JSON string (the chat template may tell them apart)
};

// An image reference as sent (data: URI, file:// URL or http(s) URL), with the JSON path it came
// from so that later errors can point at it ("messages[1].content[0].image_url").
struct ImageRef {
  std::string url;
  std::string param;
};

struct ChatRequestLimits {
  int max_images_per_request = 8;
  int max_stop_sequences = 16;
};

struct ChatRequest {
  std::string model;  // "" when the client sent none (the served model is used)
  std::vector<ChatMessage> messages;
  std::vector<ImageRef> images;   // in prompt order
  SamplingParams sampling;        // sampling.max_tokens is only meaningful when max_tokens is set
  std::optional<int> max_tokens;  // max_completion_tokens, else max_tokens; unset -> server default
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool return_token_ids = false;  // extension (vLLM's name): token ids in the response
};

// Parses and validates a request body. Sampling fields the request leaves out (or sets to null)
// take their value from `defaults` (the model's generation_config, as vLLM does). Errors are 400
// invalid_request_error with `param` set to the JSON path of the offending field and a message
// naming the value and the allowed range.
ApiResult<ChatRequest> parse_chat_request(const std::string& body, const ChatRequestLimits& limits,
                                          const SamplingParams& defaults);

}  // namespace qvl::server
