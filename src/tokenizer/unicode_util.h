// UTF-8 and Unicode helpers of the tokenizer (internal): validation, NFC (utf8proc), the GPT-2
// byte <-> symbol table of the ByteLevel pre-tokenizer/decoder, and the whitespace / word
// character classes the added-token flags use (Rust regex's Unicode `\s` and `\w`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qvl::tok {

inline constexpr size_t kValidUtf8 = static_cast<size_t>(-1);

// Offset of the first byte that does not start a well-formed UTF-8 sequence, or kValidUtf8.
size_t find_invalid_utf8(std::string_view s);

// Decodes the code point at s[i] (s must be valid UTF-8) and advances i.
char32_t next_code_point(std::string_view s, size_t& i);
// Decodes the code point that ends at s[end) (valid UTF-8, end > 0).
char32_t prev_code_point(std::string_view s, size_t end);
void append_utf8(std::string& out, char32_t cp);

// Unicode NFC of valid UTF-8 `s` into `out` (replaced). Returns false when utf8proc fails,
// which cannot happen for valid input short of memory exhaustion.
bool nfc_normalize(std::string_view s, std::string& out);
// True when `s` is certainly unchanged by NFC (every code point is in ranges that neither
// decompose, reorder nor compose with a neighbour); false means "maybe".
bool nfc_quick_unchanged(std::string_view s);

// The GPT-2 / ByteLevel map: byte -> symbol code point (printable bytes map to themselves,
// the others to U+0100 + n), and back (-1 for code points that are not symbols).
char32_t byte_to_symbol(uint8_t b);
int symbol_to_byte(char32_t cp);

// Rust regex `\s` (Unicode White_Space) and `\w` (alphabetic, marks, decimal digits,
// connector punctuation, join controls; approximated by general category).
bool is_unicode_whitespace(char32_t cp);
bool is_word_char(char32_t cp);

}  // namespace qvl::tok
