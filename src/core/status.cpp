#include "core/status.h"

#include "core/check.h"

namespace qvl {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& context) const {
  if (is_ok()) return *this;
  return Status(code_, context + ": " + message_);
}

void result_access_failure(const Status& status) {
  detail::check_failed(__FILE__, __LINE__, "value() on a failed Result: " + status.to_string());
}

void result_constructed_from_ok() {
  detail::check_failed(__FILE__, __LINE__, "Result constructed from an OK Status");
}

namespace detail {
void check_failed(const char* file, int line, const std::string& message) {
  throw CheckFailure(std::string(file) + ":" + std::to_string(line) + ": " + message);
}
}  // namespace detail

}  // namespace qvl
