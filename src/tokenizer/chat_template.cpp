#include "tokenizer/chat_template.h"

#include <string>

namespace qvl {

namespace {

// FNV-1a 64 of the template text in assets/chat_template.json (chat_template_test recomputes
// it from the file, so the two cannot drift apart).
constexpr uint64_t kBuiltinTemplateHash = 0xf67afe266c470df1ull;

constexpr std::string_view kImagePad = "<|image_pad|>";
constexpr std::string_view kVideoPad = "<|video_pad|>";

constexpr std::string_view kToolsHeader =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr std::string_view kToolsFooter =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string where(size_t message, size_t part) {
  return "message " + std::to_string(message) + " part " + std::to_string(part);
}

Status check_text(std::string_view text, const std::string& at) {
  for (std::string_view pad : {kImagePad, kVideoPad}) {
    if (text.find(pad) != std::string_view::npos) {
      return invalid_argument(at + ": text contains " + std::string(pad) +
                              ", which is reserved for image and video placeholders");
    }
  }
  return Status::ok();
}

class Renderer {
 public:
  Renderer(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options)
      : messages_(messages), options_(options) {}

  Result<std::string> render() {
    if (messages_.empty()) return invalid_argument("the conversation has no messages");
    if (options_.merge_size <= 0) {
      return invalid_argument("merge_size " + std::to_string(options_.merge_size) + " must be positive");
    }
    const bool leading_system = messages_[0].role == ChatRole::kSystem;
    if (!options_.tools_json.empty()) {
      out_ += "<|im_start|>system\n";
      if (leading_system) {
        QVL_RETURN_IF_ERROR(append_text_only(messages_[0], 0, "system"));
        out_ += "\n\n";
      }
      out_ += kToolsHeader;
      for (const std::string& tool : options_.tools_json) {
        out_ += "\n";
        out_ += tool;
      }
      out_ += kToolsFooter;
    } else if (leading_system) {
      out_ += "<|im_start|>system\n";
      QVL_RETURN_IF_ERROR(append_text_only(messages_[0], 0, "system"));
      out_ += "<|im_end|>\n";
    }
    for (size_t i = 0; i < messages_.size(); ++i) {
      const ChatMessage& m = messages_[i];
      if (!m.tool_calls.empty() && m.role != ChatRole::kAssistant) {
        return invalid_argument("message " + std::to_string(i) + ": tool_calls are only allowed on assistant messages");
      }
      switch (m.role) {
        case ChatRole::kSystem:
          // The template renders only messages[0] as system; it drops later ones.
          if (i > 0) {
            QVL_RETURN_IF_ERROR(check_no_media(m, i, "system"));
          }
          break;
        case ChatRole::kUser:
          out_ += "<|im_start|>user\n";
          QVL_RETURN_IF_ERROR(append_with_media(m, i));
          out_ += "<|im_end|>\n";
          break;
        case ChatRole::kAssistant:
          QVL_RETURN_IF_ERROR(append_assistant(m, i));
          break;
        case ChatRole::kTool: {
          if (i == 0 || messages_[i - 1].role != ChatRole::kTool) out_ += "<|im_start|>user";
          out_ += "\n<tool_response>\n";
          QVL_RETURN_IF_ERROR(append_with_media(m, i));
          out_ += "\n</tool_response>";
          if (i + 1 == messages_.size() || messages_[i + 1].role != ChatRole::kTool) out_ += "<|im_end|>\n";
          break;
        }
      }
    }
    if (options_.add_generation_prompt) out_ += "<|im_start|>assistant\n";
    return std::move(out_);
  }

 private:
  Status check_no_media(const ChatMessage& m, size_t index, const char* role) {
    if (const auto* parts = std::get_if<std::vector<ContentPart>>(&m.content)) {
      for (size_t p = 0; p < parts->size(); ++p) {
        if ((*parts)[p].kind != ContentPart::Kind::kText) {
          return invalid_argument(where(index, p) + ": " + role +
                                  " messages cannot carry images or videos (the template would drop them)");
        }
      }
    }
    return Status::ok();
  }

  // System and assistant content: the template renders the text parts only.
  Status append_text_only(const ChatMessage& m, size_t index, const char* role) {
    QVL_RETURN_IF_ERROR(check_no_media(m, index, role));
    if (const auto* s = std::get_if<std::string>(&m.content)) {
      QVL_RETURN_IF_ERROR(check_text(*s, "message " + std::to_string(index)));
      out_ += *s;
      return Status::ok();
    }
    const auto& parts = std::get<std::vector<ContentPart>>(m.content);
    for (size_t p = 0; p < parts.size(); ++p) {
      QVL_RETURN_IF_ERROR(check_text(parts[p].text, where(index, p)));
      out_ += parts[p].text;
    }
    return Status::ok();
  }

  // User and tool content: text, images and videos in order.
  Status append_with_media(const ChatMessage& m, size_t index) {
    if (const auto* s = std::get_if<std::string>(&m.content)) {
      QVL_RETURN_IF_ERROR(check_text(*s, "message " + std::to_string(index)));
      out_ += *s;
      return Status::ok();
    }
    const auto& parts = std::get<std::vector<ContentPart>>(m.content);
    for (size_t p = 0; p < parts.size(); ++p) {
      const ContentPart& part = parts[p];
      switch (part.kind) {
        case ContentPart::Kind::kText:
          QVL_RETURN_IF_ERROR(check_text(part.text, where(index, p)));
          out_ += part.text;
          break;
        case ContentPart::Kind::kImage: {
          auto pads = image_pad_count(part.grid, options_.merge_size);
          if (!pads.is_ok()) return pads.status().with_context(where(index, p));
          ++image_count_;
          if (options_.add_vision_id) out_ += "Picture " + std::to_string(image_count_) + ": ";
          out_ += "<|vision_start|>";
          out_.reserve(out_.size() + static_cast<size_t>(*pads) * kImagePad.size() + 32);
          for (int64_t k = 0; k < *pads; ++k) out_ += kImagePad;
          out_ += "<|vision_end|>";
          break;
        }
        case ContentPart::Kind::kVideo:
          return unimplemented(where(index, p) + ": video input is not supported");
      }
    }
    return Status::ok();
  }

  Status append_assistant(const ChatMessage& m, size_t index) {
    out_ += "<|im_start|>assistant\n";
    QVL_RETURN_IF_ERROR(append_text_only(m, index, "assistant"));
    // Jinja truthiness of message.content: a non-empty string or a non-empty list.
    const bool content_truthy = std::visit([](const auto& c) { return !c.empty(); }, m.content);
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      if ((k == 0 && content_truthy) || k > 0) out_ += "\n";
      out_ += "<tool_call>\n{\"name\": \"";
      out_ += m.tool_calls[k].name;
      out_ += "\", \"arguments\": ";
      out_ += m.tool_calls[k].arguments;
      out_ += "}\n</tool_call>";
    }
    out_ += "<|im_end|>\n";
    return Status::ok();
  }

  const std::vector<ChatMessage>& messages_;
  const ChatTemplateOptions& options_;
  std::string out_;
  int image_count_ = 0;
};

}  // namespace

const char* chat_role_name(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem:
      return "system";
    case ChatRole::kUser:
      return "user";
    case ChatRole::kAssistant:
      return "assistant";
    case ChatRole::kTool:
      return "tool";
  }
  return "?";
}

Result<int64_t> image_pad_count(const ImageGrid& g, int merge_size) {
  // Far above any grid the image processor produces (its default cap is 16384 pads), low
  // enough that a hostile grid cannot make the prompt text explode.
  constexpr int64_t kMaxPads = int64_t{1} << 20;
  if (g.t <= 0 || g.h <= 0 || g.w <= 0 || merge_size <= 0 || g.h % merge_size != 0 || g.w % merge_size != 0) {
    return invalid_argument("image grid [" + std::to_string(g.t) + ", " + std::to_string(g.h) + ", " +
                            std::to_string(g.w) + "] is not positive with h and w divisible by merge size " +
                            std::to_string(merge_size));
  }
  if (g.t > kMaxPads || g.h > kMaxPads || g.w > kMaxPads ||
      static_cast<int64_t>(g.t) * g.h * g.w / (static_cast<int64_t>(merge_size) * merge_size) > kMaxPads) {
    return out_of_range("image grid [" + std::to_string(g.t) + ", " + std::to_string(g.h) + ", " + std::to_string(g.w) +
                        "] needs more than " + std::to_string(kMaxPads) + " image tokens");
  }
  return static_cast<int64_t>(g.t) * g.h * g.w / (static_cast<int64_t>(merge_size) * merge_size);
}

Result<std::string> render_chat_template(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) {
  return Renderer(messages, options).render();
}

Result<ChatPrompt> build_chat_prompt(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                     const ChatTemplateOptions& options) {
  ChatPrompt prompt;
  QVL_ASSIGN_OR_RETURN(prompt.text, render_chat_template(messages, options));
  for (const ChatMessage& m : messages) {
    if (m.role != ChatRole::kUser && m.role != ChatRole::kTool) continue;
    if (const auto* parts = std::get_if<std::vector<ContentPart>>(&m.content)) {
      for (const ContentPart& p : *parts) {
        if (p.kind == ContentPart::Kind::kImage) prompt.images.push_back(p.grid);
      }
    }
  }
  QVL_RETURN_IF_ERROR(tokenizer.encode_append(prompt.text, prompt.ids));
  // One contiguous pad run per image, of the expected length, in order.
  const int32_t pad = tokenizer.special_ids().image_pad;
  if (!prompt.images.empty() && pad < 0) return failed_precondition("the tokenizer has no <|image_pad|> token");
  size_t run = 0;
  for (size_t i = 0; i < prompt.ids.size();) {
    if (prompt.ids[i] != pad) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < prompt.ids.size() && prompt.ids[j] == pad) ++j;
    if (run >= prompt.images.size()) {
      return internal_error("prompt has more <|image_pad|> runs than its " + std::to_string(prompt.images.size()) +
                            " images");
    }
    const int64_t want = *image_pad_count(prompt.images[run], options.merge_size);
    if (static_cast<int64_t>(j - i) != want) {
      return internal_error("image " + std::to_string(run) + ": " + std::to_string(j - i) +
                            " <|image_pad|> tokens, expected " + std::to_string(want));
    }
    ++run;
    i = j;
  }
  if (run != prompt.images.size()) {
    return internal_error("prompt has " + std::to_string(run) + " <|image_pad|> runs for " +
                          std::to_string(prompt.images.size()) + " images");
  }
  return prompt;
}

bool is_builtin_chat_template(std::string_view jinja_text) {
  return fnv1a64(jinja_text) == kBuiltinTemplateHash;
}

}  // namespace qvl
