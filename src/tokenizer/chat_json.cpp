#include "tokenizer/chat_json.h"

#include "tokenizer/py_json.h"

namespace qvl {

namespace {

using nlohmann::ordered_json;

std::string at(int m) {
  return "message " + std::to_string(m);
}
std::string at(int m, int p) {
  return "message " + std::to_string(m) + " part " + std::to_string(p);
}

std::string short_dump(const ordered_json& j) {
  std::string s = j.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

Result<ContentPart> parse_part(const ordered_json& part, int m, int p, const ImagePartResolver& resolve_image) {
  if (!part.is_object())
    return invalid_argument(at(m, p) + ": a content part must be an object, got " + short_dump(part));
  const std::string type = part.contains("type") && part["type"].is_string() ? part["type"].get<std::string>() : "";
  ContentPart out;
  // The template's own order of tests: image, then video, then anything with a "text".
  if (type == "image" || type == "image_url" || part.contains("image") || part.contains("image_url")) {
    out.kind = ContentPart::Kind::kImage;
    QVL_ASSIGN_OR_RETURN(out.grid, resolve_image(part, m, p));
    return out;
  }
  if (type == "video" || type == "video_url" || part.contains("video")) {
    out.kind = ContentPart::Kind::kVideo;
    return out;
  }
  if (type == "text" || (type.empty() && part.contains("text"))) {
    if (!part.contains("text") || !part["text"].is_string()) {
      return invalid_argument(at(m, p) + ": a text part needs a string \"text\", got " + short_dump(part));
    }
    out.kind = ContentPart::Kind::kText;
    out.text = part["text"].get<std::string>();
    return out;
  }
  return invalid_argument(at(m, p) + ": content part type \"" + type + "\" is not supported (text, image_url, image)");
}

Result<ToolCall> parse_tool_call(const ordered_json& call, int m, int k) {
  const std::string where = at(m) + " tool_calls[" + std::to_string(k) + "]";
  if (!call.is_object()) return invalid_argument(where + " must be an object, got " + short_dump(call));
  // As the template: `{%- if tool_call.function %}{%- set tool_call = tool_call.function %}`.
  const ordered_json& fn = (call.contains("function") && call["function"].is_object()) ? call["function"] : call;
  ToolCall out;
  if (!fn.contains("name") || !fn["name"].is_string()) {
    return invalid_argument(where + ": function.name must be a string, got " + short_dump(call));
  }
  out.name = fn["name"].get<std::string>();
  if (!fn.contains("arguments")) return invalid_argument(where + ": function.arguments is missing");
  const ordered_json& args = fn["arguments"];
  out.arguments = args.is_string() ? args.get<std::string>() : python_json_dumps(args);
  return out;
}

}  // namespace

Result<ImageGrid> image_grid_from_part(const ordered_json& part, int message_index, int part_index) {
  const ordered_json* grid = part.contains("grid") ? &part["grid"] : nullptr;
  if (!grid || !grid->is_array() || grid->size() != 3 || !(*grid)[0].is_number_integer() ||
      !(*grid)[1].is_number_integer() || !(*grid)[2].is_number_integer()) {
    return invalid_argument(at(message_index, part_index) + ": an image part needs \"grid\": [t, h, w], got " +
                            short_dump(part));
  }
  return ImageGrid{(*grid)[0].get<int>(), (*grid)[1].get<int>(), (*grid)[2].get<int>()};
}

Result<std::vector<ChatMessage>> parse_chat_messages(const ordered_json& messages,
                                                     const ImagePartResolver& resolve_image) {
  if (!messages.is_array()) return invalid_argument("messages must be an array, got " + short_dump(messages));
  std::vector<ChatMessage> out;
  out.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const int m = static_cast<int>(i);
    const ordered_json& msg = messages[i];
    if (!msg.is_object()) return invalid_argument(at(m) + " must be an object, got " + short_dump(msg));
    if (!msg.contains("role") || !msg["role"].is_string())
      return invalid_argument(at(m) + ": \"role\" must be a string");
    const std::string role = msg["role"].get<std::string>();
    ChatMessage cm;
    if (role == "system") {
      cm.role = ChatRole::kSystem;
    } else if (role == "user") {
      cm.role = ChatRole::kUser;
    } else if (role == "assistant") {
      cm.role = ChatRole::kAssistant;
    } else if (role == "tool") {
      cm.role = ChatRole::kTool;
    } else {
      return invalid_argument(at(m) + ": role \"" + role + "\" is not supported (system, user, assistant, tool)");
    }
    const ordered_json content = msg.contains("content") ? msg["content"] : ordered_json();
    if (content.is_string()) {
      cm.content = content.get<std::string>();
    } else if (content.is_array()) {
      std::vector<ContentPart> parts;
      for (size_t p = 0; p < content.size(); ++p) {
        QVL_ASSIGN_OR_RETURN(ContentPart part, parse_part(content[p], m, static_cast<int>(p), resolve_image));
        parts.push_back(std::move(part));
      }
      cm.content = std::move(parts);
    } else if (content.is_null()) {
      // Absent (or null, as OpenAI clients send next to tool_calls): rendered as nothing, like
      // the template's undefined content.
      cm.content = std::vector<ContentPart>{};
    } else {
      return invalid_argument(at(m) + ": content must be a string, an array of parts or null, got " +
                              short_dump(content));
    }
    if (msg.contains("tool_calls") && !msg["tool_calls"].is_null()) {
      const ordered_json& calls = msg["tool_calls"];
      if (!calls.is_array()) return invalid_argument(at(m) + ": tool_calls must be an array");
      if (cm.role != ChatRole::kAssistant && !calls.empty()) {
        return invalid_argument(at(m) + ": tool_calls are only allowed on assistant messages, not " + role);
      }
      for (size_t k = 0; k < calls.size(); ++k) {
        QVL_ASSIGN_OR_RETURN(ToolCall call, parse_tool_call(calls[k], m, static_cast<int>(k)));
        cm.tool_calls.push_back(std::move(call));
      }
    }
    out.push_back(std::move(cm));
  }
  return out;
}

Result<std::vector<std::string>> parse_chat_tools(const ordered_json& tools) {
  if (!tools.is_array()) return invalid_argument("tools must be an array, got " + short_dump(tools));
  std::vector<std::string> out;
  for (size_t i = 0; i < tools.size(); ++i) {
    if (!tools[i].is_object()) {
      return invalid_argument("tools[" + std::to_string(i) + "] must be an object, got " + short_dump(tools[i]));
    }
    out.push_back(python_json_dumps(tools[i]));
  }
  return out;
}

}  // namespace qvl
