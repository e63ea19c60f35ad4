// The one way API handlers report a client-visible error: throw HttpError; the server answers
// {"error":{"message":...,"type":...,"code":...}} with its status (OpenAI's error shape).
#pragma once
#include <stdexcept>
#include <string>

namespace towers::daemon {

struct HttpError : std::runtime_error {
  HttpError(int status, std::string type, const std::string& message)
      : std::runtime_error(message), status(status), type(std::move(type)) {}
  int status;
  std::string type;  // invalid_request_error, not_found_error, conflict_error, rate_limit_error, server_error, ...
  int retry_after = 0;  // seconds, for 429/503
};

inline HttpError bad_request(const std::string& m) { return HttpError(400, "invalid_request_error", m); }
inline HttpError not_found(const std::string& m) { return HttpError(404, "not_found_error", m); }
inline HttpError conflict(const std::string& m) { return HttpError(409, "conflict_error", m); }

}  // namespace towers::daemon
