// The one place where an error becomes HTTP. Everything below the edge (Catalog, Scheduler, engine)
// fails with a Status code; the API handlers add what only they know (the request field at fault,
// and for NotFound what was not found) and error_reply() turns that into the HTTP status and OpenAI's
// error object {"error":{"message","type","param","code"}}, code always a string. A streamed reply
// that fails after its first event ends with sse_error_event() instead (then "data: [DONE]").
//
//   Status code         HTTP  type                   code (default)
//   invalid_argument    400   invalid_request_error  invalid_request_error
//   unimplemented       400   invalid_request_error  unsupported_parameter
//   not_found           404   not_found_error        not_found (handlers: session_not_found,
//                                                     segment_not_found, endpoint_not_found)
//   permission_denied   403   permission_error       permission_denied
//   conflict            409   conflict_error         conflict
//   resource_exhausted  429   rate_limit_error       rate_limit_exceeded          Retry-After: 1
//   unavailable         503   overloaded_error       service_unavailable          Retry-After: 1
//   cancelled           499   cancelled_error        cancelled (the client is gone; rarely seen)
//   corruption, io_error, error (unclassified)
//                       500   server_error           server_error
// Codes that change the HTTP status their Status code would give:
//   model_not_found          404  invalid_request_error  (as OpenAI answers it)
//   context_length_exceeded  400  invalid_request_error  (resource_exhausted: the prompt is too long)
//   request_too_large        413  invalid_request_error  (resource_exhausted: limits.max_body_bytes)
//   session_limit_reached    507  capacity_error         (resource_exhausted: limits.max_sessions)
//   method_not_allowed       405  invalid_request_error
//   unknown_parameter        400  invalid_request_error  (a field towerd does not know)
// The HTTP edge's own (docs/http.md), before a request reaches a handler:
//   invalid_api_key          401  authentication_error   (TCP: missing or wrong bearer token)
//   request_timeout          408  invalid_request_error  (the body did not arrive in time)
//   unsupported_media_type   415  invalid_request_error  (TCP: a body that is not application/json)
//   request_header_too_large 431  invalid_request_error
//   host_not_allowed, origin_not_allowed  403 (permission_denied: TCP Host / Origin refused)
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "engine/base/status.h"

namespace towers::daemon {

// A Status as the client will see it. Ok when status is.
struct ApiStatus {
  Status status;
  std::string param;  // the request field at fault ("" = none: null in the error object)
  std::string code;   // OpenAI's string code when it says more than the Status code ("" = the default)

  ApiStatus() = default;
  ApiStatus(Status s) : status(std::move(s)) {}  // NOLINT: implicit on purpose
  ApiStatus(Status s, std::string param, std::string code = {})
      : status(std::move(s)), param(std::move(param)), code(std::move(code)) {}
  bool ok() const { return status.ok(); }
};

// A bad value of request field `param` (400 invalid_request_error).
ApiStatus invalid_field(std::string param, std::string message);
// NotFound gets `code` (and `param`): what the handler asked for, e.g. "session_not_found". Other
// codes pass unchanged.
ApiStatus not_found_as(Status st, std::string code, std::string param = {});

struct ErrorReply {
  int http_status = 500;
  int retry_after = 0;   // seconds; 0 = no Retry-After header
  nlohmann::json body;   // {"error":{"message","type","param","code"}}
};
ErrorReply error_reply(const ApiStatus& e);  // e must not be ok
// "event: error\ndata: {"error":{...}}\n\n": what the OpenAI SDKs raise as an APIError mid-stream.
std::string sse_error_event(const ApiStatus& e);

}  // namespace towers::daemon
