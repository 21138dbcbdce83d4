// Building a generation request from `qvl run`'s command line: --prompt with `<image>` markers,
// --image files, --system and --task, turned into the chat messages the Qwen3-VL template
// renders, then token ids (image pads expanded) and prepared images.
//
// Placement rule: each `<image>` in the prompt marks where the next --image goes, in order;
// images left without a marker come first, before the text, as the chat template places images
// sent ahead of the text (that is where most Qwen3-VL prompts have them). More markers than
// images is an error. A --task supplies the text: caption, scene and detect have built-in
// prompts (detect takes an optional category list from --prompt); vqa asks --prompt as the
// question.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "engine/loader.h"
#include "tokenizer/chat_template.h"

namespace qvl::cli {

inline constexpr const char* kImageMarker = "<image>";

struct PromptInput {
  std::string prompt;               // --prompt
  std::vector<std::string> images;  // --image paths, in order
  std::string system;               // --system ("" = none)
  std::string task;                 // --task: "", caption, vqa, scene, detect
};

// The names --task accepts.
const std::vector<std::string>& task_names();

// The user text for `task` given the --prompt text (which may be empty).
Result<std::string> task_text(const std::string& task, const std::string& prompt, size_t num_images);

// The user turn's parts: `text` split at <image> markers with image i at marker i; images past
// the last marker go first. `grids` in --image order; `order` receives the --image indices in
// prompt order.
Result<std::vector<ContentPart>> user_parts(const std::string& text, const std::vector<ImageGrid>& grids,
                                            std::vector<size_t>* order);

struct CliRequest {
  GenerationRequest request;
  std::string prompt_text;  // the templated prompt (pads expanded), for --json and debugging
};

// Reads and preprocesses the images, renders the chat template and tokenizes. Errors name the
// file or the count at fault.
Result<CliRequest> build_cli_request(const PromptInput& input, const LoadedModel& model,
                                     const SamplingParams& sampling);

}  // namespace qvl::cli
