#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace qvl::server {

std::string ApiError::to_json() const {
  nlohmann::json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  // Messages may quote client bytes; replace invalid UTF-8 instead of throwing.
  return nlohmann::json{{"error", e}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ApiError bad_request(std::string message, std::string param, std::string code) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

ApiError api_error_from_status(const Status& status, std::string param) {
  ApiError e;
  e.message = status.message();
  e.param = std::move(param);
  switch (status.code()) {
    case StatusCode::kOk:  // a caller bug; answer as an internal error rather than 200
    case StatusCode::kInternal:
      e.http_status = 500;
      e.type = "server_error";
      e.param.clear();
      break;
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kDataLoss:
    case StatusCode::kUnimplemented:
      e.http_status = 400;
      break;
    case StatusCode::kUnauthenticated:
      e.http_status = 401;
      e.code = "invalid_api_key";
      break;
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "server_error";
      break;
    case StatusCode::kCancelled:
      e.http_status = 499;
      e.type = "server_error";
      break;
  }
  if (status.code() == StatusCode::kOk) e.message = "internal error: an OK status was reported as a failure";
  return e;
}

}  // namespace qvl::server
