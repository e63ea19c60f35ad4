// The API's routes, in one table that dispatch (handle_request, daemon/api.cc), the metrics' route
// label and the docs (docs/api.md "Routes", checked by tests/test_http_edge.cc) all read. A pattern's
// "{...}" stands for one non-empty path segment, handed to the handler. A path no route matches is
// 404 to dispatch and "other" to metrics, and a method outside the ones the API uses is "other" to
// metrics, so no caller can add label series.
#pragma once
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace towers::daemon {

struct Service;
struct HttpRequest;
class HttpResponder;
struct ApiStatus;

// path_param: what the pattern's "{...}" matched ("" when it has none).
using RouteHandler = ApiStatus (*)(Service& svc, const HttpRequest& req, HttpResponder& out,
                                   const std::string& path_param);

struct Route {
  std::string_view pattern;  // "/v1/sessions/{id}/messages"
  std::string_view methods;  // the methods it answers, "GET PUT DELETE"; another one is 405
  RouteHandler handler;
};

std::span<const Route> routes();
// The route `path` is on (nullptr: none), and what its "{...}" matched.
const Route* match_route(std::string_view path, std::string* path_param = nullptr);
std::vector<std::string_view> methods_of(const Route& route);  // {"GET", "PUT", "DELETE"}
bool route_allows(const Route& route, std::string_view method);

std::string_view route_label(std::string_view path);  // its route's pattern, or "other"
std::string_view method_label(std::string_view method);

}  // namespace towers::daemon
