#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "core/check.h"
#include "tokenizer/unicode_util.h"

namespace qvl::tok {

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens, const std::vector<std::string>& patterns)
    : tokens_(tokens) {
  QVL_CHECK_EQ(tokens.size(), patterns.size());
  nodes_.emplace_back();
  for (size_t t = 0; t < patterns.size(); ++t) {
    const std::string& p = patterns[t];
    if (p.empty()) continue;  // `tokenizers` ignores empty added tokens
    int32_t node = 0;
    for (char ch : p) {
      const uint8_t b = static_cast<uint8_t>(ch);
      int32_t c = child(node, b);
      if (c < 0) {
        c = static_cast<int32_t>(nodes_.size());
        auto& next = nodes_[node].next;
        next.insert(std::lower_bound(next.begin(), next.end(), std::make_pair(b, int32_t{-1})), {b, c});
        nodes_.emplace_back();
      }
      node = c;
    }
    nodes_[node].token = static_cast<int32_t>(t);
    first_byte_[static_cast<uint8_t>(p[0])] = true;
  }
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t b) const {
  const auto& next = nodes_[node].next;
  auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(b, int32_t{-1}));
  return (it != next.end() && it->first == b) ? it->second : -1;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Piece>& out) const {
  size_t start_offset = 0;  // end of the previous accepted match
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    // Longest pattern starting at pos.
    int32_t node = 0, token = -1;
    size_t stop = pos;
    for (size_t i = pos; i < text.size(); ++i) {
      node = child(node, static_cast<uint8_t>(text[i]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) {
        token = nodes_[node].token;
        stop = i + 1;
      }
    }
    if (token < 0) {
      ++pos;
      continue;
    }
    size_t start = pos;
    pos = stop;  // the search resumes after this match even if it is discarded below
    const AddedToken& t = tokens_[token];
    if (t.single_word) {
      const bool start_space = start == 0 || !is_word_char(prev_code_point(text, start));
      size_t j = stop;
      const bool stop_space = stop == text.size() || !is_word_char(next_code_point(text, j));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t s = start;
      while (s > 0) {
        const char32_t cp = prev_code_point(text, s);
        if (!is_unicode_whitespace(cp)) break;
        size_t k = s - 1;
        while (k > 0 && (static_cast<uint8_t>(text[k]) & 0xC0) == 0x80) --k;
        s = k;
      }
      start = std::max(s, start_offset);
    }
    if (t.rstrip) {
      size_t e = stop;
      while (e < text.size()) {
        size_t k = e;
        if (!is_unicode_whitespace(next_code_point(text, k))) break;
        e = k;
      }
      stop = e;
      pos = stop;
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, t.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({start_offset, text.size(), -1});
}

}  // namespace qvl::tok
