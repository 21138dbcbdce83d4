// The Qwen3 / Qwen3-VL tokenizer, loaded from a Hugging Face `tokenizer.json`, producing ids
// identical to the `tokenizers` library (0.23) for that file. The pipeline is the one the file
// declares, and loading refuses anything else with a Status naming the field:
//   1. added tokens are cut out of the raw text first (leftmost-longest match over the added
//      token strings, honouring each token's lstrip / rstrip / single_word flags); tokens with
//      `normalized: true` are matched again after normalisation;
//   2. every other piece is NFC-normalised (utf8proc);
//   3. the Split pre-tokenizer regex (PCRE2, UTF + UCP, JIT-compiled once at load) cuts it into
//      pre-tokens (behaviour "Isolated"), then ByteLevel maps bytes to symbols;
//   4. byte-level BPE merges each pre-token by merge rank (lowest rank first, leftmost first).
// Decoding maps ids back to bytes (the ByteLevel decoder) and turns invalid UTF-8 into U+FFFD
// per maximal invalid subsequence, as Rust's `String::from_utf8_lossy` does.
//
// A Tokenizer is immutable after load and safe to use from several threads at once (the BPE
// word cache is internally synchronised). Ids are int32_t throughout, as the engine uses them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace qvl {

// One entry of tokenizer.json's "added_tokens", with the flags that steer matching.
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;      // skipped by decode(skip_special_tokens = true)
  bool normalized = false;   // matched in the normalised text instead of the raw text
  bool lstrip = false;       // swallows the whitespace on its left
  bool rstrip = false;       // swallows the whitespace on its right
  bool single_word = false;  // only matches when not inside a word
};

// Ids of the tokens the chat template and the engine refer to by name; -1 when the
// tokenizer has no such token.
struct SpecialTokenIds {
  int32_t endoftext = -1;     // <|endoftext|>
  int32_t im_start = -1;      // <|im_start|>
  int32_t im_end = -1;        // <|im_end|>
  int32_t vision_start = -1;  // <|vision_start|>
  int32_t vision_end = -1;    // <|vision_end|>
  int32_t image_pad = -1;     // <|image_pad|>
  int32_t video_pad = -1;     // <|video_pad|>
};

class TokenizerImpl;

class Tokenizer {
 public:
  // Loads `dir`/tokenizer.json, and `dir`/tokenizer_config.json when present (eos token).
  static Result<std::shared_ptr<const Tokenizer>> load_dir(const std::string& dir);
  // Loads one tokenizer.json file (no tokenizer_config.json).
  static Result<std::shared_ptr<const Tokenizer>> load_file(const std::string& tokenizer_json_path);
  // Builds from the text of a tokenizer.json (and optionally of a tokenizer_config.json);
  // `origin` names the source in error messages.
  static Result<std::shared_ptr<const Tokenizer>> from_json(std::string_view tokenizer_json,
                                                            std::string_view tokenizer_config_json = {},
                                                            const std::string& origin = "tokenizer.json");

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`, special tokens in the text matched atomically (as `tokenizers` with
  // add_special_tokens irrelevant: Qwen adds no BOS/EOS). Fails only on invalid UTF-8
  // (kInvalidArgument naming the byte offset).
  Result<std::vector<int32_t>> encode(std::string_view text) const;
  // Appends the ids of `text` to `out` (same as encode; avoids a copy when building prompts).
  Status encode_append(std::string_view text, std::vector<int32_t>& out) const;

  // The text of `ids`; ids outside the vocabulary are skipped, as `tokenizers` does. With
  // skip_special_tokens, tokens whose added-token entry says `special: true` are left out.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The raw bytes one token stands for (possibly an incomplete UTF-8 sequence); empty for
  // ids outside the vocabulary.
  std::string_view token_bytes(int32_t id) const;
  // The token's string as tokenizer.json spells it (byte-level symbols, e.g. "Ġthe"), or the
  // added token's content; empty for unknown ids.
  std::string_view id_to_token(int32_t id) const;
  // Looks up a token string in the added tokens, then in the vocabulary.
  std::optional<int32_t> token_to_id(std::string_view token) const;

  bool is_special(int32_t id) const;
  bool is_added(int32_t id) const;
  // One past the largest id (base vocabulary plus added tokens).
  int32_t vocab_size() const;
  const std::vector<AddedToken>& added_tokens() const;
  const SpecialTokenIds& special_ids() const;
  // tokenizer_config.json's eos_token, resolved to an id, when it was loaded.
  std::optional<int32_t> eos_token_id() const;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  std::unique_ptr<TokenizerImpl> impl_;
};

}  // namespace qvl
