#include "daemon/routes.h"

#include <array>

#include "daemon/service.h"

namespace towers::daemon {

namespace {

using namespace api;

constexpr std::array kRoutes = {
    Route{"/", "GET", handle_ui},
    Route{"/healthz", "GET", handle_healthz},
    Route{"/metrics", "GET", handle_metrics},
    Route{"/v1/pool", "GET", handle_pool},
    Route{"/v1/policy", "GET PUT POST", handle_policy},
    Route{"/v1/models", "GET", handle_models},
    Route{"/v1/models/{name}", "GET", handle_models},
    Route{"/v1/chat/completions", "POST", handle_chat_completions},
    Route{"/v1/completions", "POST", handle_completions},
    Route{"/v1/embeddings", "POST", handle_embeddings},
    Route{"/v1/responses", "POST", handle_responses},
    Route{"/v1/responses/{id}", "GET DELETE", handle_response},
    Route{"/v1/compress", "POST", handle_compress},
    Route{"/v1/segments", "GET POST", handle_segments},
    Route{"/v1/segments/{name}", "GET PUT DELETE", handle_segment},
    Route{"/v1/segments/{name}/link", "POST", handle_segment_link},
    Route{"/v1/segments/{name}/compress", "POST", handle_segment_compress},
    Route{"/v1/segments/{name}/thaw", "POST", handle_segment_thaw},
    Route{"/v1/sessions", "GET POST", handle_sessions},
    Route{"/v1/sessions/{id}", "GET DELETE", handle_session},
    Route{"/v1/sessions/{id}/messages", "POST", handle_session_messages},
    Route{"/v1/sessions/{id}/transcript", "GET", handle_session_transcript},
};

// Splits off the next "/segment"; false at the end.
bool next_segment(std::string_view& rest, std::string_view& segment) {
  if (rest.empty() || rest.front() != '/') return false;
  const size_t end = rest.find('/', 1);
  segment = rest.substr(1, end == std::string_view::npos ? std::string_view::npos : end - 1);
  rest.remove_prefix(end == std::string_view::npos ? rest.size() : end);
  return true;
}

bool matches(std::string_view pattern, std::string_view path, std::string* param) {
  std::string_view p, s;
  for (;;) {
    const bool more_p = next_segment(pattern, p), more_s = next_segment(path, s);
    if (!more_p || !more_s) return more_p == more_s;
    const bool is_param = p.size() > 2 && p.front() == '{' && p.back() == '}';
    if (is_param ? s.empty() : p != s) return false;
    if (is_param && param) *param = s;
  }
}

}  // namespace

std::span<const Route> routes() { return kRoutes; }

const Route* match_route(std::string_view path, std::string* path_param) {
  for (const Route& r : kRoutes) {
    std::string param;
    if (matches(r.pattern, path, &param)) {
      if (path_param) *path_param = std::move(param);
      return &r;
    }
  }
  return nullptr;
}

std::vector<std::string_view> methods_of(const Route& route) {
  std::vector<std::string_view> methods;
  for (std::string_view rest = route.methods; !rest.empty();) {
    const size_t space = rest.find(' ');
    methods.push_back(rest.substr(0, space));
    rest.remove_prefix(space == std::string_view::npos ? rest.size() : space + 1);
  }
  return methods;
}

bool route_allows(const Route& route, std::string_view method) {
  for (std::string_view m : methods_of(route)) {
    if (m == method) return true;
  }
  return false;
}

std::string_view route_label(std::string_view path) {
  const Route* r = match_route(path);
  return r ? r->pattern : "other";
}

std::string_view method_label(std::string_view method) {
  for (std::string_view m : {"GET", "POST", "PUT", "DELETE", "HEAD"}) {
    if (method == m) return m;
  }
  return "other";
}

}  // namespace towers::daemon
