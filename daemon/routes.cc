#include "daemon/routes.h"

#include <array>

namespace towers::daemon {

namespace {

// Every route of daemon/api*.cc; "{...}" stands for one non-empty path segment.
constexpr std::array<std::string_view, 15> kRoutes = {
    "/healthz",
    "/metrics",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/pool",
    "/v1/policy",
    "/v1/compress",
    "/v1/segments",
    "/v1/segments/{name}",
    "/v1/segments/{name}/compress",
    "/v1/segments/{name}/thaw",
    "/v1/sessions",
    "/v1/sessions/{id}",
    "/v1/sessions/{id}/messages",
    "/v1/sessions/{id}/transcript",
};

// Splits off the next "/segment"; false at the end.
bool next_segment(std::string_view& rest, std::string_view& segment) {
  if (rest.empty() || rest.front() != '/') return false;
  const size_t end = rest.find('/', 1);
  segment = rest.substr(1, end == std::string_view::npos ? std::string_view::npos : end - 1);
  rest.remove_prefix(end == std::string_view::npos ? rest.size() : end);
  return true;
}

bool matches(std::string_view pattern, std::string_view path) {
  std::string_view p, s;
  for (;;) {
    const bool more_p = next_segment(pattern, p), more_s = next_segment(path, s);
    if (!more_p || !more_s) return more_p == more_s;
    if (p.size() > 2 && p.front() == '{' && p.back() == '}' ? s.empty() : p != s) return false;
  }
}

}  // namespace

std::string_view route_label(std::string_view path) {
  for (std::string_view r : kRoutes) {
    if (matches(r, path)) return r;
  }
  return "other";
}

std::string_view method_label(std::string_view method) {
  for (std::string_view m : {"GET", "POST", "PUT", "DELETE", "HEAD"}) {
    if (method == m) return m;
  }
  return "other";
}

}  // namespace towers::daemon
