// Fuzz target for the chat-message JSON parser and the chat template renderer: any bytes are
// either refused (invalid JSON, or a Status from parsing/rendering) or rendered; a rendered
// prompt holds exactly one <|vision_start|> per image part. Never crashes, never asserts.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/chat_json.h"
#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = nlohmann::ordered_json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  qvl::ChatTemplateOptions opts;
  if (j.is_object()) {
    if (j.contains("tools")) {
      auto tools = qvl::parse_chat_tools(j["tools"]);
      if (tools.is_ok()) opts.tools_json = *tools;
    }
    opts.add_vision_id = j.value("add_vision_id", false) == true;
    j = j.value("messages", nlohmann::ordered_json());
  }
  auto msgs = qvl::parse_chat_messages(j);
  if (!msgs.is_ok()) return 0;
  auto text = qvl::render_chat_template(*msgs, opts);
  if (!text.is_ok()) return 0;
  size_t images = 0;
  for (const auto& m : *msgs) {
    if (m.role != qvl::ChatRole::kUser && m.role != qvl::ChatRole::kTool) continue;
    if (const auto* parts = std::get_if<std::vector<qvl::ContentPart>>(&m.content)) {
      for (const auto& p : *parts) images += p.kind == qvl::ContentPart::Kind::kImage;
    }
  }
  size_t starts = 0;
  for (size_t at = text->find("<|vision_start|>"); at != std::string::npos;
       at = text->find("<|vision_start|>", at + 1)) {
    ++starts;
  }
  // User text may itself contain <|vision_start|>, so the prompt has at least one per image.
  if (starts < images) std::abort();
  return 0;
}
