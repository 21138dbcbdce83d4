#include "tokenizer/py_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace qvl {

namespace {

void dump_string(const std::string& s, std::string& out) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
}

// Python's float.__repr__: shortest round-trip digits; positional notation when the decimal
// exponent is in [-4, 16), with ".0" added to integral values; otherwise d[.ddd]e±XX.
void dump_float(double x, std::string& out) {
  if (std::isnan(x)) {
    out += "NaN";
    return;
  }
  if (std::isinf(x)) {
    out += x > 0 ? "Infinity" : "-Infinity";
    return;
  }
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.2345e-05"
  bool negative = false;
  if (!sci.empty() && sci[0] == '-') {
    negative = true;
    sci.erase(0, 1);
  }
  const size_t epos = sci.find('e');
  std::string digits = sci.substr(0, epos);
  const int exp10 = std::atoi(sci.c_str() + epos + 1);
  if (digits.size() > 1) digits.erase(1, 1);  // drop the '.'
  // digits d1 d2 ... with value 0.d1d2... × 10^(exp10 + 1); Python's "decpt" is exp10 + 1.
  const int decpt = exp10 + 1;
  if (negative) out.push_back('-');
  if (decpt > -4 + 0 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits;
      out.append(decpt - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, decpt);
      out.push_back('.');
      out += digits.substr(decpt);
    }
    return;
  }
  out.push_back(digits[0]);
  if (digits.size() > 1) {
    out.push_back('.');
    out += digits.substr(1);
  }
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  out += ebuf;
}

void dump(const nlohmann::ordered_json& v, std::string& out) {
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::null:
      out += "null";
      break;
    case T::boolean:
      out += v.get<bool>() ? "true" : "false";
      break;
    case T::number_integer:
      out += std::to_string(v.get<int64_t>());
      break;
    case T::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      break;
    case T::number_float:
      dump_float(v.get<double>(), out);
      break;
    case T::string:
      dump_string(v.get_ref<const std::string&>(), out);
      break;
    case T::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        dump(e, out);
      }
      out.push_back(']');
      break;
    }
    case T::object: {
      out.push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        dump_string(it.key(), out);
        out += ": ";
        dump(it.value(), out);
      }
      out.push_back('}');
      break;
    }
    default:
      out += "null";
      break;  // binary / discarded never come from parsed JSON text
  }
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dump(value, out);
  return out;
}

}  // namespace qvl
