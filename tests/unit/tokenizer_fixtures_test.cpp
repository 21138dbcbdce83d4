#include <gtest/gtest.h>

#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/test_support.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer_test_util.h"

namespace qvl::test {

namespace {
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

std::shared_ptr<const Tokenizer> qwen_tokenizer() {
  static std::once_flag once;
  static std::shared_ptr<const Tokenizer> tok;
  std::call_once(once, [] {
    const std::string dir = tokenizer_dir();
    if (dir.empty()) return;
    auto r = Tokenizer::load_dir(dir);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    if (r.is_ok()) tok = *r;
  });
  return tok;
}

std::shared_ptr<const tok::BpeModel> bpe_model_of(const Tokenizer&) {
  static std::once_flag once;
  static std::shared_ptr<tok::BpeModel> model;
  std::call_once(once, [] {
    auto impl = load_tokenizer_impl(slurp(tokenizer_dir() + "/tokenizer.json"), {}, "tokenizer.json");
    EXPECT_TRUE(impl.is_ok()) << impl.status().to_string();
    if (impl.is_ok()) model = std::make_shared<tok::BpeModel>(std::move((*impl)->bpe));
  });
  return model;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream f(path, std::ios::binary);
  std::string line;
  while (std::getline(f, line)) lines.push_back(line);
  return lines;
}

const std::vector<std::string>& corpus_strings() {
  static const std::vector<std::string> corpus = [] {
    std::vector<std::string> out;
    for (const std::string& line : read_lines(fixture_path("tokenizer/corpus.jsonl"))) {
      out.push_back(nlohmann::json::parse(line).get<std::string>());
    }
    EXPECT_GE(out.size(), 2000u) << "tests/fixtures/tokenizer/corpus.jsonl";
    return out;
  }();
  return corpus;
}

}  // namespace qvl::test

namespace qvl {
namespace {

// The corpus file and its MANIFEST (written together by make_tokenizer_corpus.py) agree.
TEST(TokenizerFixtures, CorpusMatchesItsManifest) {
  const auto& corpus = test::corpus_strings();
  size_t bytes = 0;
  for (const std::string& s : corpus) bytes += s.size();
  std::string strings_line, bytes_line;
  for (const std::string& line : test::read_lines(test::fixture_path("tokenizer/MANIFEST"))) {
    if (line.rfind("  strings: ", 0) == 0 && strings_line.empty()) strings_line = line;
    if (line.rfind("  utf8_bytes: ", 0) == 0) bytes_line = line;
  }
  EXPECT_EQ(strings_line, "  strings: " + std::to_string(corpus.size()));
  EXPECT_EQ(bytes_line, "  utf8_bytes: " + std::to_string(bytes));
}

}  // namespace
}  // namespace qvl
