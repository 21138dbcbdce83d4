// The official Qwen3-VL *Instruct* chat template (assets/chat_template.json, the
// `chat_template.json` of Qwen/Qwen3-VL-*-Instruct), implemented natively: no Jinja at run
// time. The output is byte-identical to transformers' `apply_chat_template` with that template
// (Jinja trim_blocks + lstrip_blocks, `tojson` = json.dumps(ensure_ascii=False)) followed by
// Qwen3VLProcessor's expansion of each image's `<|image_pad|>` into grid_t·grid_h·grid_w /
// merge_size² copies. What the template does, and so what this does:
//   - tools (if any) open a system turn listing each tool's JSON; a system message at index 0
//     is rendered first (its text parts only);
//   - system messages anywhere else are dropped, as the template drops them;
//   - user and tool turns render text, image and video parts in order; an image is
//     `<|vision_start|><|image_pad|>…<|vision_end|>` (with "Picture N: " before it when
//     add_vision_id); consecutive tool messages share one `<|im_start|>user` turn, each
//     wrapped in <tool_response>;
//   - assistant turns render their text parts, then each tool call as a <tool_call> block;
//   - add_generation_prompt appends `<|im_start|>assistant\n`.
// Structures the template would render wrongly or that qvl cannot serve are refused with a
// Status naming the message (and part) index: an empty conversation, images in system or
// assistant messages (the processor would count an image the text never mentions), video
// parts (no video pipeline), bad grids, and text containing `<|image_pad|>` or `<|video_pad|>`
// (the processor would treat it as an image placeholder).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/image_grid.h"
#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace qvl {


struct ContentPart {
  enum class Kind { kText, kImage, kVideo };
  Kind kind = Kind::kText;
  std::string text;  // kText
  ImageGrid grid;    // kImage
};

enum class ChatRole { kSystem, kUser, kAssistant, kTool };
const char* chat_role_name(ChatRole role);  // "system", "user", "assistant", "tool"

struct ToolCall {
  std::string name;
  // Rendered verbatim: the JSON string an OpenAI client sends, or an object already serialised
  // with python_json_dumps (py_json.h), which is what the template's `tojson` would produce.
  std::string arguments;
};

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  // A plain string, or an ordered list of parts, as in the OpenAI schema. The difference is
  // visible in one place: an assistant message's tool calls are preceded by "\n" when its
  // content is truthy in Jinja (a non-empty string, or a non-empty list).
  std::variant<std::string, std::vector<ContentPart>> content;
  std::vector<ToolCall> tool_calls;  // assistant only
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  bool add_vision_id = false;  // "Picture N: " before each image
  int merge_size = 2;          // vision spatial_merge_size: pads per image = t·h·w / merge_size²
  // Tool definitions, each serialised as the template's `tojson` would (python_json_dumps).
  std::vector<std::string> tools_json;
};

// The templated prompt with each image's pad run already expanded.
Result<std::string> render_chat_template(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options);

struct ChatPrompt {
  std::string text;               // the rendered prompt (pads expanded)
  std::vector<int32_t> ids;       // its token ids
  std::vector<ImageGrid> images;  // grids in prompt order, one pad run each in `ids`
};

// Renders and tokenizes. Checks that `ids` hold exactly one contiguous run of <|image_pad|>
// per image, of the expected length, so the engine can rely on it.
Result<ChatPrompt> build_chat_prompt(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                     const ChatTemplateOptions& options);

// Number of <|image_pad|> tokens one image of grid `g` expands to; kInvalidArgument for a grid
// with a non-positive side or h, w not divisible by merge_size, kOutOfRange above 2^20 pads.
Result<int64_t> image_pad_count(const ImageGrid& g, int merge_size);

// True when `jinja_text` is the official Qwen3-VL instruct template this module implements
// (compared by content hash), so callers can warn when a checkpoint ships a different one.
bool is_builtin_chat_template(std::string_view jinja_text);

}  // namespace qvl
