// OpenAI response bodies for chat completions: the `chat.completion` object of a non-streamed
// request and the `chat.completion.chunk` objects of a streamed one, framed as server-sent events.
// A stream is, in order: one chunk with delta {"role":"assistant","content":""}, content chunks
// with delta {"content": ...}, one chunk with an empty delta and the finish_reason, then (only with
// stream_options.include_usage) one chunk with "choices": [] and the usage, then `data: [DONE]`.
// With include_usage every other chunk carries "usage": null, as OpenAI's do.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace qvl::server {

struct ResponseMeta {
  std::string id;       // "chatcmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
  bool include_usage = false;     // streams only
  bool return_token_ids = false;  // extension: token ids alongside text
};

// OpenAI's finish_reason for a finished request: "stop" or "length". Cancelled and errored
// requests are not answered with a finish_reason (they end in an error), so they map to "".
const char* openai_finish_reason(FinishReason reason);

// {"id","object":"chat.completion","created","model","system_fingerprint","choices":[{"index":0,
//  "message":{"role":"assistant","content","refusal":null},"logprobs":null,"finish_reason"}],
//  "usage":{"prompt_tokens","completion_tokens","total_tokens"}} (+ token ids when asked).
std::string completion_json(const ResponseMeta& meta, const std::string& text, FinishReason finish, const Usage& usage,
                            const std::vector<int32_t>& prompt_ids, const std::vector<int32_t>& token_ids);

// The chunk objects, already framed as SSE events ("data: {...}\n\n").
std::string sse_role_chunk(const ResponseMeta& meta, const std::vector<int32_t>& prompt_ids);
std::string sse_content_chunk(const ResponseMeta& meta, const std::string& text, const std::vector<int32_t>& token_ids);
std::string sse_finish_chunk(const ResponseMeta& meta, FinishReason finish);
std::string sse_usage_chunk(const ResponseMeta& meta, const Usage& usage);
// An error inside a stream after the 200 was sent: data: {"error":{...}} (what vLLM sends; the
// official clients raise it as an APIError).
std::string sse_error_event(const std::string& error_json);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// "chatcmpl-" followed by 24 random hex digits.
std::string new_completion_id();

}  // namespace qvl::server
