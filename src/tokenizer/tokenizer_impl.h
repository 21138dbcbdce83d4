// Internal state of a Tokenizer (see tokenizer.h): built by tokenizer_load.cpp from
// tokenizer.json, used by tokenizer.cpp to encode and decode.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace qvl {

class TokenizerImpl {
 public:
  bool nfc = false;  // normalizer: NFC or none
  std::unique_ptr<tok::RegexSplitter> splitter;
  tok::BpeModel bpe;
  tok::WordCache cache;

  std::vector<AddedToken> added;
  tok::AddedTokenMatcher raw_matcher;         // tokens with normalized == false
  tok::AddedTokenMatcher normalized_matcher;  // tokens with normalized == true (NFC'd content)

  std::vector<std::string> token_str;              // id -> tokenizer.json spelling ("" for holes)
  std::vector<std::string> token_bytes;            // id -> bytes it decodes to
  std::vector<uint8_t> flags;                      // id -> kAdded | kSpecial
  std::unordered_map<std::string, int32_t> vocab;  // tokenizer.json spelling -> id
  std::unordered_map<std::string, int32_t> added_by_content;
  SpecialTokenIds special;
  std::optional<int32_t> eos;

  static constexpr uint8_t kAdded = 1, kSpecial = 2;

  Status encode_append(std::string_view text, std::vector<int32_t>& out) const;

 private:
  Status encode_normalized_piece(std::string_view piece, std::vector<int32_t>& out) const;
  Status encode_plain(std::string_view text, std::vector<int32_t>& out) const;
};

// Parses tokenizer.json (+ optional tokenizer_config.json) into an impl (tokenizer_load.cpp).
Result<std::unique_ptr<TokenizerImpl>> load_tokenizer_impl(std::string_view tokenizer_json,
                                                           std::string_view tokenizer_config_json,
                                                           const std::string& origin);

}  // namespace qvl
