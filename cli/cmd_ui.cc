// towerctl ui: towerd's page (GET /) in a browser, for a towerd that listens only on its Unix socket.
// It listens on a loopback TCP port and forwards each connection to the socket, one request at a
// time: every request head is checked first with the daemon's own TCP rules (daemon/http_guard.h:
// a loopback Host, no Origin but this page's own, JSON bodies) and, except the page itself, must
// carry the token printed in the page's address. The socket trusts its peer's uid, which here is
// the user who runs towerctl: without those checks any web page in a local browser, or any local
// user, could drive towerd through the port (CSRF, DNS rebinding).
#include <utility>  // before Boost.Asio 1.74, which uses std::exchange without it

#include <boost/asio.hpp>
#include <boost/beast/http.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <thread>

#include "cli/client.h"
#include "cli/commands.h"
#include "daemon/http_guard.h"
#include "daemon/random_id.h"

namespace towers::cli {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using unix_socket = asio::local::stream_protocol;

namespace {

constexpr size_t kMaxHead = 64 * 1024;

// One request's head, as far as forwarding it needs.
struct RequestHead {
  std::string method, target, host, origin, authorization, content_type;
  size_t content_length = 0;
  bool chunked = false;
};

// The head (with its final empty line), read by Boost.Beast's parser; nullopt when it is not an
// HTTP/1.x request head.
std::optional<RequestHead> parse_head(std::string_view head) {
  http::request_parser<http::empty_body> p;
  p.header_limit(kMaxHead);
  boost::system::error_code ec;  // after the head it may ask for the body (not given here): only the head counts
  p.put(asio::buffer(head.data(), head.size()), ec);
  if (!p.is_header_done()) return std::nullopt;
  const auto& req = p.get();
  auto field = [&](http::field f) { return std::string(req[f]); };
  RequestHead h;
  h.method = std::string(req.method_string());
  h.target = std::string(req.target());
  h.host = field(http::field::host);
  h.origin = field(http::field::origin);
  h.authorization = field(http::field::authorization);
  h.content_type = field(http::field::content_type);
  h.content_length = static_cast<size_t>(p.content_length().value_or(0));
  h.chunked = p.chunked();
  return h;
}

// An error reply in towerd's JSON shape; the connection closes after it.
nlohmann::json error_body(const std::string& code, const std::string& message) {
  return {{"error", {{"message", message}, {"type", "invalid_request_error"}, {"param", nullptr}, {"code", code}}}};
}

void refuse(tcp::socket& browser, int status, const nlohmann::json& error) {
  const std::string body = error.dump() + "\n";
  const std::string reply = "HTTP/1.1 " + std::to_string(status) + " Refused\r\nContent-Type: application/json\r\n"
                            "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  boost::system::error_code ec;
  asio::write(browser, asio::buffer(reply), ec);
}

struct Forwarder {
  std::string socket_path, token;
  std::vector<std::string> own_origins;

  // Why this request may not pass (nullopt: it may): the status and the error body.
  std::optional<std::pair<int, nlohmann::json>> refusal(const RequestHead& h) const {
    daemon::TcpRequestView view{h.method, h.host, h.origin, h.authorization, h.content_type, h.content_length > 0};
    // The page itself is what the browser opens from the printed address: no token on it.
    const bool page = h.method == "GET" && (h.target == "/" || h.target.rfind("/?", 0) == 0);
    const daemon::ApiStatus st = daemon::check_tcp_request(view, own_origins, page ? "" : token);
    if (!st.ok()) {
      daemon::ErrorReply r = daemon::error_reply(st);
      if (r.body["error"].value("code", "") == "invalid_api_key") {
        r.body["error"]["message"] = "towerctl ui needs the token of the address it printed (?token=...)";
      }
      return std::pair{r.http_status, r.body};
    }
    if (h.chunked) return std::pair{411, error_body("length_required", "chunked request bodies are not forwarded; send Content-Length")};
    return std::nullopt;
  }

  // One browser connection: requests go to towerd one head at a time (each checked), replies come
  // back as they are.
  void serve(tcp::socket browser) {
    unix_socket::socket daemon(browser.get_executor());
    boost::system::error_code ec;
    daemon.connect(unix_socket::endpoint(socket_path), ec);
    if (ec) return refuse(browser, 502, error_body("towerd_unreachable", "cannot reach towerd at " + socket_path + ": " + ec.message()));
    std::thread replies([&] {
      std::array<char, 16384> buf;
      boost::system::error_code rec;
      for (;;) {
        const size_t n = daemon.read_some(asio::buffer(buf), rec);
        if (rec || !asio::write(browser, asio::buffer(buf.data(), n), rec) || rec) break;
      }
      browser.shutdown(tcp::socket::shutdown_both, rec);
    });
    std::string pending;
    std::array<char, 16384> buf;
    for (;;) {
      size_t end;
      while ((end = pending.find("\r\n\r\n")) == std::string::npos) {
        if (pending.size() > kMaxHead) {
          refuse(browser, 431, error_body("header_too_large", "the request head is larger than 64 KiB"));
          goto done;
        }
        const size_t n = browser.read_some(asio::buffer(buf), ec);
        if (ec) goto done;
        pending.append(buf.data(), n);
      }
      const auto head = parse_head(std::string_view(pending).substr(0, end + 4));
      if (!head) {
        refuse(browser, 400, error_body("bad_request", "not an HTTP/1.1 request"));
        goto done;
      }
      if (auto why = refusal(*head)) {
        refuse(browser, why->first, why->second);
        goto done;
      }
      size_t need = end + 4 + head->content_length;
      while (pending.size() < need) {
        const size_t n = browser.read_some(asio::buffer(buf), ec);
        if (ec) goto done;
        pending.append(buf.data(), n);
      }
      if (!asio::write(daemon, asio::buffer(pending.data(), need), ec) || ec) goto done;
      pending.erase(0, need);
    }
  done:
    daemon.shutdown(unix_socket::socket::shutdown_both, ec);
    browser.shutdown(tcp::socket::shutdown_both, ec);
    replies.join();
  }
};

}  // namespace

void add_ui(CLI::App& app) {
  auto o = std::make_shared<ClientOptions>();
  auto port = std::make_shared<uint16_t>(0);
  auto open = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("ui", "Open towerd's page (the towers, the pool, a chat box) in a browser.");
  cmd->footer(
      "towerd listens on a Unix socket, which a browser cannot reach: this forwards a loopback TCP port to it\n"
      "and prints the page's address (with a fresh token in it; requests without the token, from another\n"
      "web page's origin or for another host are refused). It runs until Ctrl-C.\n"
      "Examples:\n"
      "  towerctl ui                      # prints http://127.0.0.1:PORT/?token=...\n"
      "  towerctl ui --port 8765 --open   # a fixed port, and open the default browser (xdg-open)\n"
      "A towerd that listens on TCP itself ([server] tcp_port) serves the page at its own address.\n");
  add_client_options(cmd, *o, false);
  cmd->add_option("--port", *port, "Loopback TCP port to listen on (0 = any free port)");
  cmd->add_flag("--open", *open, "Open the page with xdg-open once it is listening");
  cmd->callback([o, port, open] {
    run_client([&] {
      // towerd must be there before a browser is sent to it.
      HttpClient c = client_for(*o, 10);
      if (HttpReply r = c.request("GET", "/healthz"); r.status != 200 && r.status != 503) throw reply_error(r);
      asio::io_context io;
      tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), *port));
      const uint16_t bound = acceptor.local_endpoint().port();
      auto fwd = std::make_shared<Forwarder>();
      fwd->socket_path = o->socket;
      fwd->token = daemon::random_hex_id("ui-") + daemon::random_hex_id("");  // 2 x 64 random bits
      fwd->own_origins = {"http://127.0.0.1:" + std::to_string(bound), "http://localhost:" + std::to_string(bound)};
      const std::string url = "http://127.0.0.1:" + std::to_string(bound) + "/?token=" + fwd->token;
      std::printf("towerd's page: %s\n(forwarding to %s; Ctrl-C stops)\n", url.c_str(), o->socket.c_str());
      std::fflush(stdout);
      if (*open) {
        const std::string command = "xdg-open '" + url + "' >/dev/null 2>&1 &";
        if (std::system(command.c_str()) != 0) std::fprintf(stderr, "towerctl: xdg-open failed; open the address above\n");
      }
      for (;;) {
        tcp::socket browser(io);
        boost::system::error_code ec;
        acceptor.accept(browser, ec);
        if (ec) continue;
        std::thread([fwd, s = std::move(browser)]() mutable { fwd->serve(std::move(s)); }).detach();
      }
    });
  });
}

}  // namespace towers::cli
