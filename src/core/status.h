// Status and Result<T>: the error channel for everything a user, a file or a request can get
// wrong. A Status carries a code and a message that names what is wrong with the value that was
// wrong ("tensor 'model.norm.weight': shape [64] expected [128]"); the server maps codes to HTTP
// statuses and the CLI prints the message and exits non-zero. Programmer invariants use
// QVL_CHECK (check.h) instead.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace qvl {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // bad request / bad option value            -> 400
  kNotFound,           // missing file, tensor, model                -> 404 (400 in request context)
  kOutOfRange,         // over a limit: pixels, tokens, body size    -> 400/413
  kFailedPrecondition, // the model/state cannot do this             -> 400
  kResourceExhausted,  // memory does not fit                        -> 503/507
  kDataLoss,           // corrupt or truncated file                  -> 400
  kUnimplemented,      // valid but not supported                    -> 400/501
  kUnauthenticated,    // wrong API key                              -> 401
  kUnavailable,        // shutting down, still loading               -> 503
  kCancelled,          // client went away
  kInternal,           // bug; should never reach a user             -> 500
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "NOT_FOUND: config.json not found in /x" — for logs and CLI output.
  std::string to_string() const;
  // Returns a copy whose message is prefixed with `context + ": "`.
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status failed_precondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status unauthenticated(std::string m) { return {StatusCode::kUnauthenticated, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Result<T>: a T or a non-ok Status. Access to the wrong alternative is a programmer error and
// fails a check (check.h), it never returns garbage.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) { ensure_not_ok(); }  // NOLINT

  bool is_ok() const { return v_.index() == 0; }
  explicit operator bool() const { return is_ok(); }

  const Status& status() const {
    static const Status kOkStatus;
    return is_ok() ? kOkStatus : std::get<1>(v_);
  }
  T& value() & { ensure_ok(); return std::get<0>(v_); }
  const T& value() const& { ensure_ok(); return std::get<0>(v_); }
  T&& value() && { ensure_ok(); return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void ensure_ok() const;
  void ensure_not_ok() const;
  std::variant<T, Status> v_;
};

[[noreturn]] void result_access_failure(const Status& status);
[[noreturn]] void result_constructed_from_ok();

template <typename T>
void Result<T>::ensure_ok() const {
  if (!is_ok()) result_access_failure(std::get<1>(v_));
}
template <typename T>
void Result<T>::ensure_not_ok() const {
  if (std::get<1>(v_).is_ok()) result_constructed_from_ok();
}

}  // namespace qvl

// Propagate a non-ok Status from an expression returning Status.
#define QVL_RETURN_IF_ERROR(expr)                      \
  do {                                                 \
    ::qvl::Status qvl_status_ = (expr);                \
    if (!qvl_status_.is_ok()) return qvl_status_;      \
  } while (0)

#define QVL_CONCAT_INNER(a, b) a##b
#define QVL_CONCAT(a, b) QVL_CONCAT_INNER(a, b)

// `QVL_ASSIGN_OR_RETURN(auto x, f());` binds the value or returns the error.
#define QVL_ASSIGN_OR_RETURN(lhs, expr) QVL_ASSIGN_OR_RETURN_IMPL(QVL_CONCAT(qvl_result_, __LINE__), lhs, expr)
#define QVL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.is_ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
