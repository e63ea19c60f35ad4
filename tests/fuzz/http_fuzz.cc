// libFuzzer target for towerd's HTTP edge (daemon/http_server.h, http_connection.h, http_guard.h):
// a real HttpServer on a Unix socket in this process, each input written by a client as the bytes
// of one connection, then its write side shut and every byte of the answer read until the server
// closes. The connection's parser and states (header, body, Expect: 100-continue, chunked bodies,
// the body limit, keep-alive and a next request, a stream) see the bytes exactly as from a socket.
// The server must close every connection once the client has shut its side (a connection left
// open would be a leak), and answer in HTTP. The same bytes' header, parsed here, also goes through
// the TCP listener's checks (check_tcp_request, is_loopback_host).
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstring>
#include <memory>
#include <thread>

#include "daemon/http_guard.h"
#include "daemon/http_server.h"
#include "fuzz/fuzz_support.h"

using namespace towers;
using namespace towers::daemon;

namespace {
constexpr const char* kTarget = "http_fuzz";

// Answers by path: a stream of two chunks, a response sent later from another thread, or at once.
void handle(const HttpRequest& req, std::shared_ptr<HttpResponder> out) {
  if (req.path == "/stream") {
    if (out->start_stream(200, "text/event-stream")) {
      out->write_chunk("data: one\n\n");
      out->write_chunk("data: two\n\n");
      out->end_stream();
    }
    return;
  }
  if (req.path == "/later") {
    out->on_close([] {});
    std::thread([out, n = req.body.size()] { out->send(200, "text/plain", std::to_string(n)); }).detach();
    return;
  }
  out->send(req.method == "POST" ? 201 : 200, "application/json",
            "{\"path\":" + std::to_string(req.path.size()) + ",\"body\":" + std::to_string(req.body.size()) + "}\n");
}

struct Server {
  std::filesystem::path path = fuzz::scratch_path(kTarget);
  std::unique_ptr<HttpServer> server;
  Server() {
    HttpServerOptions o;
    o.socket_path = path.string();
    o.max_body_bytes = 2048;  // small, so the body limit is reached
    o.io_threads = 1;
    server = std::make_unique<HttpServer>(o, handle);
    if (Status st = server->start(); !st.ok()) fuzz::die(kTarget, "cannot start the server: " + st.message());
  }
};

// One connection: the input as the client's bytes, then EOF; returns the server's answer.
std::string one_connection(const std::filesystem::path& path, std::string_view in) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    fuzz::die(kTarget, "cannot connect to the server");
  }
  timeval limit{20, 0};  // far beyond any answer: reaching it means the server kept the connection
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  size_t sent = 0;
  while (sent < in.size()) {
    const ssize_t n = ::send(fd, in.data() + sent, in.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server closed first (an answer to a bad request): read it
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string answer;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      answer.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      fuzz::die(kTarget, "the server kept a connection open 20 s after the client's EOF");
    }
    break;  // EOF or reset
  }
  ::close(fd);
  return answer;
}

// The header as the TCP listener would check it.
void tcp_checks(std::string_view in) {
  namespace http = boost::beast::http;
  http::request_parser<http::string_body> p;
  p.header_limit(64 * 1024);
  p.body_limit(2048);
  boost::system::error_code ec;
  p.put(boost::asio::buffer(in.data(), in.size()), ec);
  if (!p.is_header_done()) return;
  const auto& req = p.get();
  auto sv = [](boost::beast::string_view s) { return std::string_view(s.data(), s.size()); };
  const auto length = p.content_length();
  TcpRequestView v{sv(req.method_string()), sv(req[http::field::host]), sv(req[http::field::origin]),
                   sv(req[http::field::authorization]), sv(req[http::field::content_type]),
                   p.chunked() || (length && *length > 0)};
  for (const char* key : {"", "sekrit"}) {
    const ApiStatus r = check_tcp_request(v, {"http://localhost:3000"}, key);
    if (!r.ok() && r.status.message().empty()) fuzz::die(kTarget, "a refused TCP request without a message");
  }
  (void)is_loopback_host(v.host);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Server server;
  const std::string_view in = fuzz::text_of(data, size);
  // Not named `exchange`: with a std::filesystem::path argument, argument-dependent lookup finds
  // std::exchange(path&, string_view&), a better match than a const path&, and the first version of
  // this target called it: it assigned the input to the socket's path and never connected.
  const std::string answer = one_connection(server.path, in);
  if (!answer.empty() && answer.rfind("HTTP/1.", 0) != 0) {
    fuzz::die(kTarget, "an answer that is not HTTP: \"" + answer.substr(0, 80) + "\"");
  }
  tcp_checks(in);
  return 0;
}
