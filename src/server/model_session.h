// What the HTTP layer needs from a loaded model: a way to turn a validated chat (messages with
// ordered text and image parts, the images' bytes) into the engine's GenerationRequest, and the
// engine that runs it. The server owns neither the tokenizer nor the image pipeline; it calls
// PromptBuilder, which the CLI assembles from the model's chat template, tokenizer and image
// preprocessing (and tests replace with a double).
//
// Request preparation happens on the HTTP worker thread before anything is queued, so every
// client mistake (a corrupt image, an image over a limit, a prompt longer than the context) comes
// back as a 4xx with a message, and the engine only ever sees requests that can run.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "server/chat_request.h"

namespace qvl::server {

// One image's bytes, with the JSON path of the part it came from for error messages.
struct ImageBytes {
  std::string bytes;
  std::string param;  // e.g. "messages[0].content[1].image_url"
};

struct BuiltPrompt {
  std::vector<int32_t> prompt_ids;    // chat-templated, image pads expanded
  std::vector<PreparedImage> images;  // in prompt order
  int image_tokens = 0;               // how many of prompt_ids are image pads (for messages)
};

// Implementations must be safe to call from many threads at once.
class PromptBuilder {
 public:
  virtual ~PromptBuilder() = default;
  // Applies the chat template (with the generation prompt) and preprocesses the images.
  // Errors: a Status naming the image (its `param`) and the limit or defect, e.g.
  // kDataLoss "messages[0].content[1].image_url: truncated JPEG data".
  virtual Result<BuiltPrompt> build(const std::vector<ChatMessage>& messages,
                                    const std::vector<ImageBytes>& images) const = 0;
};

// A loaded model as the server sees it. context_length bounds prompt + completion tokens;
// default_sampling holds the model's generation_config values for fields a request leaves out.
struct ModelSession {
  std::shared_ptr<Engine> engine;
  std::shared_ptr<const PromptBuilder> prompt_builder;
  int context_length = 0;
  SamplingParams default_sampling;
};

}  // namespace qvl::server
