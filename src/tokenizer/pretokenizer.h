// The Split pre-tokenizer (internal): cuts normalised text into pre-tokens with the regex of
// tokenizer.json, compiled once with PCRE2 (UTF + UCP, JIT). `tokenizers` runs the pattern with
// Oniguruma; the two agree on this pattern except that PCRE2's `\s` also matches U+180E, so
// `\s` / `\S` are rewritten to Oniguruma's Unicode set (White_Space: \t \n \v \f \r U+0085
// and \p{Z}) before compiling. Behaviour "Isolated": every match is a piece, and so is any
// text between matches.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace qvl::tok {

// Rewrites `\s` and `\S` as described above; kInvalidArgument for `\S` inside a class.
Result<std::string> translate_onig_pattern(const std::string& pattern);

class RegexSplitter {
 public:
  static Result<std::unique_ptr<RegexSplitter>> compile(const std::string& onig_pattern);
  ~RegexSplitter();

  // Calls fn(piece) for every piece of valid UTF-8 `text`, in order, covering it entirely.
  // Fails only if PCRE2 reports a matching error (resource limits).
  template <typename Fn>
  Status split(std::string_view text, Fn&& fn) const {
    std::vector<std::pair<size_t, size_t>> spans;
    QVL_RETURN_IF_ERROR(find_spans(text, spans));
    for (auto [b, e] : spans) fn(text.substr(b, e - b));
    return Status::ok();
  }

  // The pieces as [begin, end) byte spans (appended to `spans`).
  Status find_spans(std::string_view text, std::vector<std::pair<size_t, size_t>>& spans) const;

 private:
  RegexSplitter() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qvl::tok
