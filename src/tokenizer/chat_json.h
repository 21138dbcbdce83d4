// OpenAI-style chat messages (JSON) -> ChatMessage list for the chat template. This is the one
// place that knows the JSON shapes: `content` as a string, null (assistant with tool_calls),
// or a list of parts {"type":"text","text":…}, {"type":"image_url","image_url":{"url":…}},
// {"type":"image",…}; `tool_calls` with `function.name` and `function.arguments` (a string,
// kept verbatim, or an object, serialised as the template's tojson would). Images are turned
// into grids by the caller's resolver (the server decodes and preprocesses them; the
// `qvl tokenize --template` tests give {"type":"image","grid":[t,h,w]} directly). Every
// malformed structure is a kInvalidArgument naming the message index, the part index and
// the field.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/chat_template.h"

namespace qvl {

// Returns the grid of the image described by `part` (an "image" or "image_url" part) of
// message `message_index`, part `part_index`.
using ImagePartResolver =
    std::function<Result<ImageGrid>(const nlohmann::ordered_json& part, int message_index, int part_index)>;

// A resolver for parts that carry their grid: {"type":"image","grid":[t,h,w]}.
Result<ImageGrid> image_grid_from_part(const nlohmann::ordered_json& part, int message_index, int part_index);

// Parses a JSON array of messages. Roles other than system/user/assistant/tool are refused.
Result<std::vector<ChatMessage>> parse_chat_messages(const nlohmann::ordered_json& messages,
                                                     const ImagePartResolver& resolve_image = image_grid_from_part);

// Parses an OpenAI `tools` array into the serialised form ChatTemplateOptions::tools_json wants.
Result<std::vector<std::string>> parse_chat_tools(const nlohmann::ordered_json& tools);

}  // namespace qvl
