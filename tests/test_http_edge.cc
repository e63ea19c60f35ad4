// The pure parts of towerd's HTTP edge: the metrics writer (escaping, integer counters, cumulative
// histograms), the route table and its labels (no caller-chosen series; docs/api.md lists every
// route), the TCP request checks, loopback Host names, and tcp_listen's parsing. The server itself is driven end to end by tests/daemon/check_edge_*.sh.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <set>

#include "daemon/config.h"
#include "daemon/http_guard.h"
#include "daemon/metrics_text.h"
#include "daemon/routes.h"

using namespace towers::daemon;

TEST_CASE("exposition escapes label values and help, prints counters as integers") {
  Exposition e;
  e.family("x_total", "counter", "a \\ help\nline");
  e.sample("x_total", {{"path", "a\"b\\c\nd"}}, uint64_t{1234567});
  e.gauge("g", "gauge", 0.5);
  const std::string& t = e.text();
  CHECK(t.find("# HELP x_total a \\\\ help\\nline\n") != std::string::npos);
  CHECK(t.find("x_total{path=\"a\\\"b\\\\c\\nd\"} 1234567\n") != std::string::npos);
  CHECK(t.find("g 0.5\n") != std::string::npos);
  CHECK(Exposition::format_double(0.0025) == "0.0025");
  CHECK(Exposition::format_double(1e300 * 1e300) == "+Inf");
}

TEST_CASE("exposition histograms are cumulative and end with +Inf, _sum and _count") {
  Histogram h({0.1, 1});
  for (double v : {0.05, 0.1, 0.5, 3.0}) h.observe(v);
  Exposition e;
  e.histogram("d_seconds", {{"route", "/v1/pool"}}, h);
  CHECK(e.text() ==
        "d_seconds_bucket{route=\"/v1/pool\",le=\"0.1\"} 2\n"
        "d_seconds_bucket{route=\"/v1/pool\",le=\"1\"} 3\n"
        "d_seconds_bucket{route=\"/v1/pool\",le=\"+Inf\"} 4\n"
        "d_seconds_sum{route=\"/v1/pool\"} 3.65\n"
        "d_seconds_count{route=\"/v1/pool\"} 4\n");
}

TEST_CASE("route labels come from the route table and other paths and methods are \"other\"") {
  CHECK(route_label("/v1/sessions/abc/messages") == "/v1/sessions/{id}/messages");
  CHECK(route_label("/v1/segments/plat") == "/v1/segments/{name}");
  CHECK(route_label("/v1/segments") == "/v1/segments");
  CHECK(route_label("/healthz") == "/healthz");
  CHECK(route_label("/v1/sessions//messages") == "other");
  CHECK(route_label("/v1/sessions/a/b/c") == "other");
  CHECK(route_label("/nothing\"here") == "other");
  CHECK(route_label("") == "other");
  CHECK(method_label("POST") == "POST");
  CHECK(method_label("BREW") == "other");
}

TEST_CASE("every route has a handler, its own metric label and a row in docs/api.md") {
  std::ifstream doc(std::string(TOWERS_SOURCE_DIR) + "/docs/api.md");
  REQUIRE(doc.good());
  std::map<std::string, std::string> documented;  // "| `/v1/pool` | GET | ..." -> pattern: methods
  for (std::string line; std::getline(doc, line);) {
    if (line.rfind("| `/", 0) != 0) continue;
    const size_t end = line.find("` | ");
    if (end == std::string::npos) continue;
    const size_t methods_end = line.find(" |", end + 4);
    documented[line.substr(3, end - 3)] = line.substr(end + 4, methods_end - end - 4);
  }
  std::set<std::string_view> labels;
  for (const Route& r : routes()) {
    CAPTURE(r.pattern);
    CHECK(static_cast<bool>(r.handler));
    CHECK(!methods_of(r).empty());
    // A path on the route (each "{...}" a segment) is labelled with the route's own pattern.
    std::string path(r.pattern), param;
    for (size_t open = path.find('{'); open != std::string::npos; open = path.find('{')) {
      path.replace(open, path.find('}', open) - open + 1, "x1");
    }
    CHECK(route_label(path) == r.pattern);
    CHECK(match_route(path, &param) == &r);
    CHECK(param == (path == r.pattern ? "" : "x1"));
    CHECK(labels.insert(r.pattern).second);
    // ... and docs/api.md lists it with the same methods.
    CHECK(documented.count(std::string(r.pattern)) == 1);
    CHECK(documented[std::string(r.pattern)] == r.methods);
  }
  CHECK(documented.size() == routes().size());  // and nothing more
  // The routes that metrics used to count as "other".
  for (const char* p : {"/v1/completions", "/v1/models/gpt-4o", "/v1/segments/bot/link"}) CHECK(route_label(p) != "other");
  CHECK(match_route("/v1/sessions/") == nullptr);
  const Route* session = match_route("/v1/sessions/abc");
  REQUIRE(session != nullptr);
  CHECK(route_allows(*session, "DELETE"));
  CHECK(!route_allows(*session, "PUT"));
  CHECK(!route_allows(*session, "GE"));
}

TEST_CASE("loopback Host names") {
  for (const char* h : {"localhost", "localhost:8080", "LOCALHOST", "127.0.0.1:1", "127.1.2.3", "[::1]:80", "[::1]"}) {
    CHECK_MESSAGE(is_loopback_host(h), h);
  }
  for (const char* h : {"", "evil.example", "localhost.evil.example", "10.0.0.1:80", "[::1", "[::2]:80", "0.0.0.0"}) {
    CHECK_MESSAGE(!is_loopback_host(h), h);
  }
}

namespace {
int refused_with(const TcpRequestView& r, const std::vector<std::string>& origins, std::string_view key) {
  const ApiStatus e = check_tcp_request(r, origins, key);
  return e.ok() ? 0 : error_reply(e).http_status;
}
}  // namespace

TEST_CASE("TCP requests: Host, Origin, token and Content-Type refusals") {
  const std::vector<std::string> origins = {"http://localhost:3000"};
  TcpRequestView ok{"POST", "127.0.0.1:8080", "", "", "application/json; charset=utf-8", true};
  CHECK(!refused_with(ok, origins, ""));
  auto r = ok;
  r.host = "attacker.example";
  CHECK(refused_with(r, origins, "") == 403);
  r = ok;
  r.origin = "http://attacker.example";
  CHECK(refused_with(r, origins, "") == 403);
  r.origin = "http://localhost:3000";
  CHECK(!refused_with(r, origins, ""));
  r = ok;
  r.content_type = "text/plain";
  CHECK(refused_with(r, origins, "") == 415);
  r.has_body = false;  // a bodiless POST has no type to check
  CHECK(!refused_with(r, origins, ""));
  r = ok;
  CHECK(refused_with(r, origins, "0123456789abcdef") == 401);
  r.authorization = "Bearer 0123456789abcdeX";
  CHECK(refused_with(r, origins, "0123456789abcdef") == 401);
  r.authorization = "bearer 0123456789abcdef";
  CHECK(!refused_with(r, origins, "0123456789abcdef"));
}

TEST_CASE("tcp_listen is parsed whole: loopback host, port 1-65535") {
  auto a = parse_listen_address("127.0.0.1:8080");
  REQUIRE(a.ok());
  CHECK(a->host == "127.0.0.1");
  CHECK(a->port == 8080);
  CHECK(parse_listen_address("localhost:1")->host == "127.0.0.1");
  CHECK(parse_listen_address("[::1]:65535")->port == 65535);
  for (const char* bad : {"127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:", "127.0.0.1:80x", "127.0.0.1:-1",
                          "0.0.0.0:8080", "10.1.1.1:80", "::1:80", "8080", "example.com:80", "127.0.0.1:+80"}) {
    CHECK_MESSAGE(!parse_listen_address(bad).ok(), bad);
  }
  CHECK(parse_listen_address("127.0.0.1:99999").error().find("65535") != std::string::npos);
}

TEST_CASE("the groups of a uid include its supplementary groups") {
  // root's primary group is 0; an unknown uid has only the gid it came with.
  auto g = PeerPolicy::groups_of(0, 0);
  REQUIRE(!g.empty());
  CHECK(g.front() == 0);
  CHECK(PeerPolicy::groups_of(4000000000u, 1234) == std::vector<uint32_t>{1234});
}
