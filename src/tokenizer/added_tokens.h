// Added-token matching (internal), as `tokenizers`' AddedVocabulary::find_matches does it: the
// token strings are searched leftmost-longest (at the first position where any token matches,
// the longest one wins; the search resumes after it); a single_word token is discarded when a
// word character touches it (its span is still skipped, as the Aho-Corasick iterator does);
// lstrip / rstrip extend the match over the whitespace on that side, never into a previous
// match. The text between matches is returned as plain pieces.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace qvl::tok {

struct Piece {
  size_t begin = 0, end = 0;
  int32_t id = -1;  // the added token's id, or -1 for plain text
};

class AddedTokenMatcher {
 public:
  // `patterns[i]` is matched for token `tokens[i]` (the content, or its normalised form).
  AddedTokenMatcher() = default;
  AddedTokenMatcher(const std::vector<AddedToken>& tokens, const std::vector<std::string>& patterns);

  bool empty() const { return nodes_.size() <= 1; }
  // Splits `text` into pieces covering it; appends to `out`.
  void split(std::string_view text, std::vector<Piece>& out) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
    int32_t token = -1;                             // index into tokens_ when a pattern ends here
  };
  int32_t child(int32_t node, uint8_t b) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
};

}  // namespace qvl::tok
