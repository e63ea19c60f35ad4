// The HTTP edge's one error mapping (daemon/api_error.h): every Status code and every special code
// gives the documented HTTP status, type and string code; param is the field or null; streamed
// errors are an SSE "error" event carrying the same object.
#include <nlohmann/json.hpp>

#include "daemon/api_error.h"
#include "test_support.h"

using namespace towers;
using namespace towers::daemon;
using json = nlohmann::json;

namespace {
void check_reply(const ApiStatus& e, int http, const char* type, const char* code, int retry_after = 0) {
  const ErrorReply r = error_reply(e);
  CHECK(r.http_status == http);
  CHECK(r.retry_after == retry_after);
  const json& err = r.body.at("error");
  CHECK(err.at("type") == type);
  CHECK(err.at("code") == code);
  CHECK(err.at("message") == e.status.message());
  CHECK(err.size() == 4);  // message, type, param, code: always all four
  if (e.param.empty()) CHECK(err.at("param").is_null());
  else CHECK(err.at("param") == e.param);
}
}  // namespace

TEST_CASE("each Status code maps to its HTTP status, type and default code") {
  check_reply(Status::InvalidArgument("bad"), 400, "invalid_request_error", "invalid_request_error");
  check_reply(Status::Unimplemented("no audio"), 400, "invalid_request_error", "unsupported_parameter");
  check_reply(Status::NotFound("gone"), 404, "not_found_error", "not_found");
  check_reply(Status::PermissionDenied("uid"), 403, "permission_error", "permission_denied");
  check_reply(Status::Conflict("busy"), 409, "conflict_error", "conflict");
  check_reply(Status::ResourceExhausted("queue"), 429, "rate_limit_error", "rate_limit_exceeded", 1);
  check_reply(Status::Unavailable("starting"), 503, "overloaded_error", "service_unavailable", 1);
  check_reply(Status::Cancelled("gone"), 499, "cancelled_error", "cancelled");
  check_reply(Status::Corruption("crc"), 500, "server_error", "server_error");
  check_reply(Status::IOError("disk"), 500, "server_error", "server_error");
  check_reply(Status::Error("?"), 500, "server_error", "server_error");
}

TEST_CASE("special codes change the HTTP status") {
  check_reply(ApiStatus(Status::NotFound("m"), "model", "model_not_found"), 404, "invalid_request_error", "model_not_found");
  check_reply(ApiStatus(Status::ResourceExhausted("long"), "messages", "context_length_exceeded"), 400,
              "invalid_request_error", "context_length_exceeded");
  check_reply(ApiStatus(Status::ResourceExhausted("big"), "", "request_too_large"), 413, "invalid_request_error",
              "request_too_large");
  check_reply(ApiStatus(Status::ResourceExhausted("full"), "", "session_limit_reached"), 507, "capacity_error",
              "session_limit_reached");
  check_reply(ApiStatus(Status::InvalidArgument("use GET"), "", "method_not_allowed"), 405, "invalid_request_error",
              "method_not_allowed");
  check_reply(ApiStatus(Status::InvalidArgument("what"), "temprature", "unknown_parameter"), 400,
              "invalid_request_error", "unknown_parameter");
  // A subject code keeps its Status code's HTTP status.
  check_reply(ApiStatus(Status::NotFound("s"), "", "session_not_found"), 404, "not_found_error", "session_not_found");
}

TEST_CASE("not_found_as names the subject of NotFound only") {
  ApiStatus nf = not_found_as(Status::NotFound("x"), "segment_not_found", "bot");
  CHECK(nf.code == "segment_not_found");
  CHECK(nf.param == "bot");
  ApiStatus other = not_found_as(Status::Conflict("busy"), "segment_not_found", "bot");
  CHECK(other.code.empty());
  CHECK(other.param.empty());
  CHECK(error_reply(other).http_status == 409);
  ApiStatus field = invalid_field("temperature", "too hot");
  CHECK(error_reply(field).body["error"]["param"] == "temperature");
}

TEST_CASE("a streamed error is an SSE error event with the same object") {
  const ApiStatus e(Status::IOError("the reply could not be stored"), "", "");
  const std::string ev = sse_error_event(e);
  const std::string head = "event: error\ndata: ";
  REQUIRE(ev.rfind(head, 0) == 0);
  REQUIRE(ev.size() > head.size() + 2);
  CHECK(ev.substr(ev.size() - 2) == "\n\n");
  const json body = json::parse(ev.substr(head.size(), ev.size() - head.size() - 2));
  CHECK(body == error_reply(e).body);
  CHECK(ev.find('\n', head.size()) == ev.size() - 2);  // one data line
}
