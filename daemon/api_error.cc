#include "daemon/api_error.h"

#include <string_view>

namespace towers::daemon {

namespace {

struct Kind {
  int http_status;
  const char* type;
  const char* code;
  int retry_after;
};

Kind kind_of(Status::Code code) {
  using C = Status::Code;
  switch (code) {
    case C::kInvalidArgument: return {400, "invalid_request_error", "invalid_request_error", 0};
    case C::kUnimplemented: return {400, "invalid_request_error", "unsupported_parameter", 0};
    case C::kNotFound: return {404, "not_found_error", "not_found", 0};
    case C::kPermissionDenied: return {403, "permission_error", "permission_denied", 0};
    case C::kConflict: return {409, "conflict_error", "conflict", 0};
    case C::kResourceExhausted: return {429, "rate_limit_error", "rate_limit_exceeded", 1};
    case C::kUnavailable: return {503, "overloaded_error", "service_unavailable", 1};
    case C::kCancelled: return {499, "cancelled_error", "cancelled", 0};
    case C::kOk:
    case C::kError:
    case C::kCorruption:
    case C::kIOError: break;
  }
  return {500, "server_error", "server_error", 0};
}

// Codes whose HTTP status differs from their Status code's.
constexpr struct {
  std::string_view code;
  Kind kind;
} kSpecialCodes[] = {
    {"model_not_found", {404, "invalid_request_error", "model_not_found", 0}},
    {"context_length_exceeded", {400, "invalid_request_error", "context_length_exceeded", 0}},
    {"request_too_large", {413, "invalid_request_error", "request_too_large", 0}},
    {"session_limit_reached", {507, "capacity_error", "session_limit_reached", 0}},
    {"method_not_allowed", {405, "invalid_request_error", "method_not_allowed", 0}},
    {"unknown_parameter", {400, "invalid_request_error", "unknown_parameter", 0}},
    {"invalid_api_key", {401, "authentication_error", "invalid_api_key", 0}},
    {"request_timeout", {408, "invalid_request_error", "request_timeout", 0}},
    {"unsupported_media_type", {415, "invalid_request_error", "unsupported_media_type", 0}},
    {"request_header_too_large", {431, "invalid_request_error", "request_header_too_large", 0}},
};

}  // namespace

ApiStatus invalid_field(std::string param, std::string message) {
  return ApiStatus(Status::InvalidArgument(std::move(message)), std::move(param));
}

ApiStatus not_found_as(Status st, std::string code, std::string param) {
  if (!st.is_not_found()) return st;
  return ApiStatus(std::move(st), std::move(param), std::move(code));
}

ErrorReply error_reply(const ApiStatus& e) {
  Kind k = kind_of(e.status.code());
  for (const auto& s : kSpecialCodes) {
    if (s.code == e.code) k = s.kind;
  }
  const std::string code = e.code.empty() ? k.code : e.code;
  const std::string& message = e.status.message().empty() ? std::string(code_name(e.status.code())) : e.status.message();
  nlohmann::json param = e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param);
  return {k.http_status, k.retry_after,
          {{"error", {{"message", message}, {"type", k.type}, {"param", param}, {"code", code}}}}};
}

std::string sse_error_event(const ApiStatus& e) {
  return "event: error\ndata: " +
         error_reply(e).body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

}  // namespace towers::daemon
