// Always-on checks for programmer invariants (never for user input: that is Status).
// A failed check throws qvl::CheckFailure carrying file:line, the condition and both values
// of a comparison; the server turns it into a 500 for the one request and keeps serving, the
// CLI prints it and exits non-zero. Checks never compile away.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace qvl {

class CheckFailure : public std::logic_error {
 public:
  explicit CheckFailure(const std::string& what) : std::logic_error(what) {}
};

namespace detail {
[[noreturn]] void check_failed(const char* file, int line, const std::string& message);

// Streams extra context after the condition: QVL_CHECK(x > 0) << "x=" << x;
class CheckMessage {
 public:
  CheckMessage(const char* file, int line, std::string head) : file_(file), line_(line) { os_ << head; }
  template <typename T>
  CheckMessage& operator<<(const T& v) { os_ << v; return *this; }
  [[noreturn]] ~CheckMessage() noexcept(false) { check_failed(file_, line_, os_.str()); }

 private:
  const char* file_;
  int line_;
  std::ostringstream os_;
};

template <typename A, typename B>
std::pair<std::decay_t<A>, std::decay_t<B>> make_operands(const A& a, const B& b) {
  return {a, b};
}

template <typename A, typename B>
std::string format_compare(const char* expr, const A& a, const B& b) {
  std::ostringstream os;
  os << expr << " (" << a << " vs " << b << ") ";
  return os.str();
}
}  // namespace detail
}  // namespace qvl

#define QVL_CHECK(cond) \
  if (cond) {           \
  } else                \
    ::qvl::detail::CheckMessage(__FILE__, __LINE__, "check failed: " #cond " ")

#define QVL_CHECK_OP(op, a, b)                                                                  \
  if (const auto qvl_cmp_ = ::qvl::detail::make_operands((a), (b)); qvl_cmp_.first op qvl_cmp_.second) { \
  } else                                                                                        \
    ::qvl::detail::CheckMessage(__FILE__, __LINE__,                                             \
                                ::qvl::detail::format_compare("check failed: " #a " " #op " " #b, \
                                                              qvl_cmp_.first, qvl_cmp_.second))

#define QVL_CHECK_EQ(a, b) QVL_CHECK_OP(==, a, b)
#define QVL_CHECK_NE(a, b) QVL_CHECK_OP(!=, a, b)
#define QVL_CHECK_LT(a, b) QVL_CHECK_OP(<, a, b)
#define QVL_CHECK_LE(a, b) QVL_CHECK_OP(<=, a, b)
#define QVL_CHECK_GT(a, b) QVL_CHECK_OP(>, a, b)
#define QVL_CHECK_GE(a, b) QVL_CHECK_OP(>=, a, b)
