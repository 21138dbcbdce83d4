#include "tokenizer/unicode_util.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>

namespace qvl::tok {

namespace {

// Length of the well-formed sequence starting at s[i] (Unicode Table 3-7), or 0.
size_t well_formed_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const size_t left = s.size() - i;
  const uint8_t c0 = b(0);
  if (c0 < 0x80) return 1;
  auto cont = [](uint8_t c, uint8_t lo = 0x80, uint8_t hi = 0xBF) { return c >= lo && c <= hi; };
  if (c0 >= 0xC2 && c0 <= 0xDF) return (left >= 2 && cont(b(1))) ? 2 : 0;
  if (c0 >= 0xE0 && c0 <= 0xEF) {
    const uint8_t lo = c0 == 0xE0 ? 0xA0 : 0x80, hi = c0 == 0xED ? 0x9F : 0xBF;
    return (left >= 3 && cont(b(1), lo, hi) && cont(b(2))) ? 3 : 0;
  }
  if (c0 >= 0xF0 && c0 <= 0xF4) {
    const uint8_t lo = c0 == 0xF0 ? 0x90 : 0x80, hi = c0 == 0xF4 ? 0x8F : 0xBF;
    return (left >= 4 && cont(b(1), lo, hi) && cont(b(2)) && cont(b(3))) ? 4 : 0;
  }
  return 0;
}

struct ByteTables {
  std::array<char32_t, 256> to_symbol{};
  std::array<int16_t, 512> to_byte{};
  ByteTables() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      // GPT-2 keeps '!'..'~', '¡'..'¬' and '®'..'ÿ' as themselves and shifts the rest
      // (control bytes, space, DEL, NBSP, soft hyphen) to U+0100 + n in byte order.
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_symbol[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      to_byte[to_symbol[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables tables;
  return tables;
}

}  // namespace

size_t find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = well_formed_length(s, i);
    if (n == 0) return i;
    i += n;
  }
  return kValidUtf8;
}

char32_t next_code_point(std::string_view s, size_t& i) {
  const uint8_t c0 = static_cast<uint8_t>(s[i]);
  if (c0 < 0x80) {
    ++i;
    return c0;
  }
  auto c = [&](size_t k) { return static_cast<char32_t>(static_cast<uint8_t>(s[i + k]) & 0x3F); };
  char32_t cp;
  if (c0 < 0xE0) {
    cp = (static_cast<char32_t>(c0 & 0x1F) << 6) | c(1);
    i += 2;
  } else if (c0 < 0xF0) {
    cp = (static_cast<char32_t>(c0 & 0x0F) << 12) | (c(1) << 6) | c(2);
    i += 3;
  } else {
    cp = (static_cast<char32_t>(c0 & 0x07) << 18) | (c(1) << 12) | (c(2) << 6) | c(3);
    i += 4;
  }
  return cp;
}

char32_t prev_code_point(std::string_view s, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
  return next_code_point(s, start);
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool nfc_quick_unchanged(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const char32_t cp = next_code_point(s, i);
    // Below U+0300 nothing decomposes canonically or composes with what precedes it; CJK
    // unified ideographs, precomposed Hangul syllables and kana other than the two combining
    // sound marks (U+3099, U+309A) are NFC-stable starters that are never the second half of
    // a composition. A composition always involves a character outside these ranges, which
    // sends the whole string to utf8proc. (tokenizer_unicode_test checks these claims.)
    const bool safe = cp < 0x300 || (cp >= 0x3040 && cp <= 0x3098) || (cp >= 0x309B && cp <= 0x30FF) ||
                      (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7A3);
    if (!safe) return false;
  }
  return true;
}

bool nfc_normalize(std::string_view s, std::string& out) {
  out.clear();
  if (s.empty()) return true;
  utf8proc_uint8_t* dst = nullptr;
  // utf8proc_NFC() would stop at a NUL byte (UTF8PROC_NULLTERM); pass the length instead.
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &dst,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return false;
  out.assign(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return true;
}

char32_t byte_to_symbol(uint8_t b) {
  return byte_tables().to_symbol[b];
}

int symbol_to_byte(char32_t cp) {
  return cp < 512 ? byte_tables().to_byte[cp] : -1;
}

bool is_unicode_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_word_char(char32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace qvl::tok
