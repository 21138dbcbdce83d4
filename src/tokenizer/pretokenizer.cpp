#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <string>

namespace qvl::tok {

namespace {

// Oniguruma's Unicode `\s`: U+0009..U+000D, U+0085 and the separators (Zs, Zl, Zp).
constexpr const char* kOnigSpaceClassBody = "\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}";

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

Result<std::string> translate_onig_pattern(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[++i];
      if (n == 's') {
        out += in_class ? std::string(kOnigSpaceClassBody) : std::string("[") + kOnigSpaceClassBody + "]";
      } else if (n == 'S') {
        if (in_class) {
          return invalid_argument("pre-tokenizer regex: \\S inside a character class at offset " +
                                  std::to_string(i - 1) + " is not supported");
        }
        out += std::string("[^") + kOnigSpaceClassBody + "]";
      } else {
        out.push_back(c);
        out.push_back(n);
      }
      continue;
    }
    out.push_back(c);
    if (in_class) {
      if (c == ']') in_class = false;
    } else if (c == '[') {
      in_class = true;
      // "[^" and a ']' right after the opening bracket are part of the class, not its end.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
    }
  }
  if (in_class) return invalid_argument("pre-tokenizer regex: unterminated character class");
  return out;
}

struct RegexSplitter::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

RegexSplitter::~RegexSplitter() = default;

Result<std::unique_ptr<RegexSplitter>> RegexSplitter::compile(const std::string& onig_pattern) {
  QVL_ASSIGN_OR_RETURN(std::string pattern, translate_onig_pattern(onig_pattern));
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                   &error, &error_offset, nullptr);
  if (!code) {
    return invalid_argument("pre-tokenizer regex does not compile with PCRE2 at offset " +
                            std::to_string(error_offset) + ": " + pcre2_error_text(error) + " (pattern " +
                            onig_pattern + ")");
  }
  std::unique_ptr<RegexSplitter> splitter(new RegexSplitter());
  splitter->impl_ = std::make_unique<Impl>();
  splitter->impl_->code = code;
  // JIT is an optimisation: without it (e.g. a platform PCRE2 lacks JIT for) the interpreter
  // gives the same matches.
  splitter->impl_->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return splitter;
}

Status RegexSplitter::find_spans(std::string_view text, std::vector<std::pair<size_t, size_t>>& spans) const {
  if (text.empty()) return Status::ok();
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  if (!md) return resource_exhausted("pre-tokenizer: cannot allocate PCRE2 match data");
  pcre2_jit_stack* big_stack = nullptr;
  pcre2_match_context* mctx = nullptr;
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t prev = 0, pos = 0;
  bool have_last_end = false;
  size_t last_end = 0;
  Status status;
  while (pos <= text.size()) {
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, mctx)
                        : pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !big_stack) {
      // Very long runs can exhaust the default 32 KiB JIT stack; retry this search with a
      // large one (allocated only when needed).
      big_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
      mctx = pcre2_match_context_create(nullptr);
      if (!big_stack || !mctx) {
        status = resource_exhausted("pre-tokenizer: cannot allocate a PCRE2 JIT stack");
        break;
      }
      pcre2_jit_stack_assign(mctx, nullptr, big_stack);
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      status = resource_exhausted("pre-tokenizer: PCRE2 matching failed at byte " + std::to_string(pos) + " of " +
                                  std::to_string(text.size()) + ": " + pcre2_error_text(rc));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    if (s == e && have_last_end && last_end == e) {
      // Oniguruma's find_iter never yields an empty match right after the previous match:
      // step one character and search again.
      if (pos >= text.size()) break;
      ++pos;
      while (pos < text.size() && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (s > prev) spans.emplace_back(prev, s);
    if (e > s) spans.emplace_back(s, e);
    prev = e;
    pos = e;
    last_end = e;
    have_last_end = true;
    if (s == e) {
      if (pos >= text.size()) break;
      ++pos;
      while (pos < text.size() && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  if (status.is_ok() && prev < text.size()) spans.emplace_back(prev, text.size());
  pcre2_match_data_free(md);
  if (mctx) pcre2_match_context_free(mctx);
  if (big_stack) pcre2_jit_stack_free(big_stack);
  return status;
}

}  // namespace qvl::tok
