// OpenAI-shaped API errors. Every failure the server answers with is an ApiError: an HTTP
// status plus the body {"error": {"message", "type", "param", "code"}} that the official
// clients parse (openai-python / openai-node raise APIError subclasses from `status` and read
// `error.message`). The message always names the offending value and, for limits, the limit and
// the flag that sets it. Statuses from the rest of qvl are mapped here, in one place, so that a
// given StatusCode always becomes the same HTTP status.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "core/check.h"
#include "core/status.h"

namespace qvl::server {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";  // OpenAI's error families
  std::string param;                           // JSON path of the bad field, "" -> null
  std::string code;                            // machine-readable code, "" -> null

  // {"error":{"message":...,"type":...,"param":...|null,"code":...|null}}
  std::string to_json() const;
};

// A T or the ApiError that answers the request instead (the server-side twin of Result<T>,
// carrying the HTTP status and the OpenAI `param`/`code` fields a plain Status lacks).
template <typename T>
class [[nodiscard]] ApiResult {
 public:
  ApiResult(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  ApiResult(ApiError error) : v_(std::move(error)) {}  // NOLINT
  bool is_ok() const { return v_.index() == 0; }
  T& value() & {
    QVL_CHECK(is_ok()) << "value() on an ApiResult holding an error";
    return std::get<0>(v_);
  }
  T&& value() && {
    QVL_CHECK(is_ok()) << "value() on an ApiResult holding an error";
    return std::get<0>(std::move(v_));
  }
  const ApiError& error() const {
    QVL_CHECK(!is_ok()) << "error() on an ApiResult holding a value";
    return std::get<1>(v_);
  }

 private:
  std::variant<T, ApiError> v_;
};

// 400 invalid_request_error naming `param`.
ApiError bad_request(std::string message, std::string param = "", std::string code = "");

// Maps a Status from request preparation or the engine to an ApiError:
//   kInvalidArgument, kNotFound, kOutOfRange, kFailedPrecondition, kDataLoss, kUnimplemented -> 400
//   kUnauthenticated -> 401, kResourceExhausted -> 503, kUnavailable -> 503,
//   kCancelled -> 499 (never sent: the client is gone), kInternal -> 500 server_error.
// `param` names the request field the status is about, when known.
ApiError api_error_from_status(const Status& status, std::string param = "");

}  // namespace qvl::server
