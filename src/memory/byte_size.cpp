#include "memory/byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

namespace qvl {

namespace {

struct Unit {
  std::string_view name;  // lower case
  int64_t factor;
};

// Binary for K/M/G/T and KiB.., decimal for KB..: see the header.
constexpr Unit kUnits[] = {
    {"", 1},
    {"b", 1},
    {"k", kKiB},
    {"kib", kKiB},
    {"kb", 1000},
    {"m", kMiB},
    {"mib", kMiB},
    {"mb", 1000 * 1000},
    {"g", kGiB},
    {"gib", kGiB},
    {"gb", int64_t{1000} * 1000 * 1000},
    {"t", kGiB * 1024},
    {"tib", kGiB * 1024},
    {"tb", int64_t{1000} * 1000 * 1000 * 1000},
};

constexpr int64_t kMaxBytes = int64_t{1} << 62;

Status bad_size(std::string_view text, const char* why) {
  return invalid_argument("size '" + std::string(text) + "': " + why + " (examples: 8GiB, 7.5G, 8000MiB, 8589934592)");
}

}  // namespace

Result<int64_t> parse_byte_size(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  // Digits with at most one decimal point.
  size_t num_begin = i;
  bool seen_point = false, seen_digit = false;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.' && !seen_point) {
      seen_point = true;
    } else {
      break;
    }
  }
  if (!seen_digit) {
    if (num_begin < text.size() && text[num_begin] == '-') return bad_size(text, "negative");
    return bad_size(text, "no number");
  }
  std::string number(text.substr(num_begin, i - num_begin));
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (std::isspace(static_cast<unsigned char>(c))) break;
    unit.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) return bad_size(text, "unexpected text after the unit");

  const Unit* found = nullptr;
  for (const Unit& u : kUnits)
    if (u.name == unit) found = &u;
  if (!found) return bad_size(text, ("unknown unit '" + unit + "'").c_str());

  if (!seen_point) {
    // Whole numbers stay exact integers (no double rounding for plain byte counts).
    if (number.size() > 19) return bad_size(text, "too large");
    unsigned long long v = std::stoull(number);
    if (v > static_cast<unsigned long long>(kMaxBytes / found->factor)) return bad_size(text, "too large");
    return static_cast<int64_t>(v) * found->factor;
  }
  if (found->factor == 1) return bad_size(text, "a fraction of a byte");
  long double v = std::stold(number) * static_cast<long double>(found->factor);
  if (v > static_cast<long double>(kMaxBytes)) return bad_size(text, "too large");
  return static_cast<int64_t>(std::floor(v));
}

std::string format_bytes(int64_t bytes) {
  char buf[64];
  const char* sign = bytes < 0 ? "-" : "";
  double v = std::fabs(static_cast<double>(bytes));
  if (v >= static_cast<double>(kGiB)) {
    std::snprintf(buf, sizeof buf, "%s%.2f GiB", sign, v / static_cast<double>(kGiB));
  } else if (v >= static_cast<double>(kMiB)) {
    std::snprintf(buf, sizeof buf, "%s%.1f MiB", sign, v / static_cast<double>(kMiB));
  } else if (v >= static_cast<double>(kKiB)) {
    std::snprintf(buf, sizeof buf, "%s%.1f KiB", sign, v / static_cast<double>(kKiB));
  } else {
    std::snprintf(buf, sizeof buf, "%s%.0f B", sign, v);
  }
  return buf;
}

std::string format_mib(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / static_cast<double>(kMiB));
  return buf;
}

}  // namespace qvl
