// Chat template unit tests: the exact prompt stated in qwen3vl-spec.md §4.1/§4.2, the pad
// arithmetic, refusals with message/part indices, the template-hash check against
// assets/chat_template.json, Python-compatible JSON for tools, and `qvl tokenize` end to end.
// The conversation-by-conversation comparison with transformers is in
// tests/golden/chat_template_golden_test.cpp.
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/test_support.h"
#include "tokenizer/chat_json.h"
#include "tokenizer/py_json.h"
#include "tokenizer_test_util.h"

namespace qvl {
namespace {

using nlohmann::ordered_json;

std::string pads(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += "<|image_pad|>";
  return s;
}

Result<std::vector<ChatMessage>> parse(const char* json_text) {
  return parse_chat_messages(ordered_json::parse(json_text));
}

TEST(ChatTemplate, SpecExampleStringAndIds) {
  auto msgs = parse(R"([{"role": "user", "content": [{"type": "image", "grid": [1, 16, 16]},
                                                     {"type": "text", "text": "Describe this image."}]}])");
  ASSERT_TRUE(msgs.is_ok()) << msgs.status().to_string();
  auto text = render_chat_template(*msgs, {});
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  // §4.1 with the pad run expanded: 1·16·16 / 2² = 64 pads.
  EXPECT_EQ(*text, "<|im_start|>user\n<|vision_start|>" + pads(64) +
                       "<|vision_end|>Describe this image.<|im_end|>\n<|im_start|>assistant\n");
  auto tok = test::qwen_tokenizer();
  if (!tok) GTEST_SKIP() << "tokenizer.json missing (scripts/fetch_npm.sh)";
  auto prompt = build_chat_prompt(*tok, *msgs, {});
  ASSERT_TRUE(prompt.is_ok()) << prompt.status().to_string();
  // §4.2: 151644, 872, 198, 151652, 151655×N, 151653, …, 151645, 198, 151644, 77091, 198.
  const auto& ids = prompt->ids;
  ASSERT_GT(ids.size(), 4u + 64 + 1 + 5);
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 4), std::vector<int32_t>({151644, 872, 198, 151652}));
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 4, ids.begin() + 68), std::vector<int32_t>(64, 151655));
  EXPECT_EQ(ids[68], 151653);
  EXPECT_EQ(std::vector<int32_t>(ids.end() - 5, ids.end()), std::vector<int32_t>({151645, 198, 151644, 77091, 198}));
  ASSERT_EQ(prompt->images.size(), 1u);
  EXPECT_EQ(prompt->images[0].h, 16);
}

TEST(ChatTemplate, PadCountIsGridOverMergeSquared) {
  EXPECT_EQ(*image_pad_count({1, 86, 128}, 2), 86 * 128 / 4);  // spec: 1365×2048 image → 2752 tokens
  EXPECT_EQ(*image_pad_count({2, 4, 6}, 2), 2 * 4 * 6 / 4);
  EXPECT_FALSE(image_pad_count({1, 15, 16}, 2).is_ok());
  EXPECT_FALSE(image_pad_count({0, 16, 16}, 2).is_ok());
  // The cap is 2^20 pads: 2048·2048/4 = 2^20 passes, 2048·2050/4 = 2^20 + 1024 does not.
  EXPECT_EQ(*image_pad_count({1, 2048, 2048}, 2), int64_t{1} << 20);
  EXPECT_EQ(image_pad_count({1, 2048, 2050}, 2).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(image_pad_count({1, 1 << 30, 1 << 30}, 2).status().code(), StatusCode::kOutOfRange);
}

TEST(ChatTemplate, SystemToolsAndVisionIds) {
  auto msgs = parse(R"([
    {"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
    {"role": "user", "content": [{"type": "image", "grid": [1, 2, 2]}, {"type": "text", "text": "A?"}]},
    {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
        "function": {"name": "f", "arguments": {"x": 1.0, "y": "é"}}}]},
    {"role": "tool", "content": [{"type": "image", "grid": [1, 2, 4]}]},
    {"role": "tool", "content": "done"},
    {"role": "system", "content": "dropped"}])");
  ASSERT_TRUE(msgs.is_ok()) << msgs.status().to_string();
  ChatTemplateOptions opts;
  opts.add_vision_id = true;
  opts.add_generation_prompt = false;
  opts.tools_json = {R"({"type": "function"})"};
  auto text = render_chat_template(*msgs, opts);
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  // Written out from the template: the system text joins the tools header; null content is
  // falsy (no "\n" before the first tool call); consecutive tool messages share one user turn;
  // "Picture N: " counts images across messages; a later system message renders nothing.
  const std::string want =
      "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
      "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
      "{\"type\": \"function\"}\n</tools>\n\nFor each function call, return a json object with function name and "
      "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
      "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\nPicture 1: <|vision_start|>" +
      pads(1) +
      "<|vision_end|>A?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1.0, \"y\": \"é\"}}\n"
      "</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\nPicture 2: <|vision_start|>" +
      pads(2) +
      "<|vision_end|>\n"
      "</tool_response>\n<tool_response>\ndone\n</tool_response><|im_end|>\n";
  EXPECT_EQ(*text, want);
}

TEST(ChatTemplate, RefusesWhatTheReferenceCannotRender) {
  struct Case {
    const char* json;
    const char* needle;
  };
  const Case cases[] = {
      {R"([])", "no messages"},
      {R"([{"role": "system", "content": [{"type": "image", "grid": [1, 2, 2]}]}])", "message 0 part 0"},
      {R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "image_url",
          "image_url": {"url": "x"}, "grid": [1, 2, 2]}]}])",
       "message 1 part 0"},
      {R"([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "video"}]}])", "video"},
      {R"([{"role": "user", "content": [{"type": "image", "grid": [1, 3, 2]}]}])", "message 0 part 0: image grid"},
      {R"([{"role": "user", "content": "x<|image_pad|>"}])", "message 0: text contains <|image_pad|>"},
      {R"([{"role": "user", "content": [{"type": "text", "text": "<|video_pad|>"}]}])", "message 0 part 0"},
  };
  for (const Case& c : cases) {
    auto msgs = parse(c.json);
    Status st = msgs.is_ok() ? render_chat_template(*msgs, {}).status() : msgs.status();
    EXPECT_FALSE(st.is_ok()) << c.json;
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << st.message();
  }
  const Case parse_cases[] = {
      {R"([{"role": "developer", "content": "x"}])", "message 0: role \"developer\""},
      {R"([{"role": "user", "content": 5}])", "message 0: content"},
      {R"([{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}])",
       "message 0: tool_calls"},
      {R"([{"role": "user", "content": [{"type": "input_audio"}]}])", "message 0 part 0"},
      {R"([{"role": "user", "content": [{"type": "image"}]}])", "message 0 part 0: an image part needs"},
  };
  for (const Case& c : parse_cases) {
    auto msgs = parse(c.json);
    ASSERT_FALSE(msgs.is_ok()) << c.json;
    EXPECT_EQ(msgs.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(msgs.status().message().find(c.needle), std::string::npos) << msgs.status().message();
  }
}

TEST(ChatTemplate, BuiltinHashMatchesTheAsset) {
  std::ifstream f(std::string(QVL_SOURCE_DIR) + "/assets/chat_template.json");
  ASSERT_TRUE(f) << "assets/chat_template.json";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string tpl = nlohmann::json::parse(ss.str())["chat_template"].get<std::string>();
  EXPECT_TRUE(is_builtin_chat_template(tpl));
  EXPECT_FALSE(is_builtin_chat_template(tpl + " "));
}

// Python's json.dumps(x, ensure_ascii=False) on the same values (repr of floats: shortest
// round trip, exponent outside [1e-4, 1e16), ".0" on integral floats).
TEST(PyJson, MatchesPythonJsonDumps) {
  auto j = ordered_json::parse(R"({"z": 1, "a": [1.0, 0.0001, 1e-05, 1e16, 1e15, 2.5, -0.0, 123456789.125],
                                   "s": "é\n\"\\\t\u0001/", "n": null, "t": true, "o": {}})");
  EXPECT_EQ(python_json_dumps(j),
            "{\"z\": 1, \"a\": [1.0, 0.0001, 1e-05, 1e+16, 1000000000000000.0, 2.5, -0.0, 123456789.125], "
            "\"s\": \"é\\n\\\"\\\\\\t\\u0001/\", \"n\": null, \"t\": true, \"o\": {}}");
}

TEST(TokenizeCli, JsonlDecodeAndTemplateAgreeWithTheLibrary) {
  auto tok = test::qwen_tokenizer();
  if (!tok) GTEST_SKIP() << "tokenizer.json missing (scripts/fetch_npm.sh)";
  const std::string dir = test::scratch_dir("tokenize_cli");
  const std::vector<std::string> inputs = {"Hello, world!", "你好 <|im_end|>\n\n", ""};
  {
    std::ofstream f(dir + "/in.jsonl");
    for (const auto& s : inputs) f << nlohmann::json(s).dump() << "\n";
  }
  const std::string bin = test::qvl_binary() + " tokenize --tokenizer " + test::tokenizer_dir();
  auto r = test::run_command(bin + " --jsonl < " + dir + "/in.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  for (const auto& s : inputs) {
    ASSERT_TRUE(std::getline(lines, line));
    EXPECT_EQ(nlohmann::json::parse(line).get<std::vector<int32_t>>(), *tok->encode(s));
  }
  r = test::run_command(bin + " --decode '[151644, 872, 198, 9707]'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, tok->decode(std::vector<int32_t>{151644, 872, 198, 9707}));
  {
    std::ofstream f(dir + "/conv.json");
    f << R"({"messages": [{"role": "user", "content": [{"type": "image", "grid": [1, 4, 4]}, "x"]}]})";
  }
  r = test::run_command(bin + " --template " + dir + "/conv.json");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("message 0 part 1"), std::string::npos) << r.err;
  {
    std::ofstream f(dir + "/conv.json");
    f << R"({"messages": [{"role": "user", "content": [{"type": "image", "grid": [1, 4, 4]},
                                                       {"type": "text", "text": "x"}]}]})";
  }
  r = test::run_command(bin + " --template " + dir + "/conv.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["text"], "<|im_start|>user\n<|vision_start|>" + pads(4) +
                             "<|vision_end|>x<|im_end|>\n"
                             "<|im_start|>assistant\n");
  EXPECT_EQ(out["ids"].get<std::vector<int32_t>>(), *tok->encode(out["text"].get<std::string>()));
}

}  // namespace
}  // namespace qvl
