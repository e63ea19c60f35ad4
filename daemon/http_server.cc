#include "daemon/http_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "daemon/api_error.h"
#include "daemon/log.h"

namespace towers::daemon {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using local = asio::local::stream_protocol;
using tcp = asio::ip::tcp;

namespace {

// Errors found before a request reaches the API (daemon/api_error.h maps them like the API's own).
template <class Responder>
void send_error(Responder& r, const ApiStatus& e) {
  const ErrorReply er = error_reply(e);
  std::vector<std::pair<std::string, std::string>> headers;
  if (er.retry_after > 0) headers.push_back({"Retry-After", std::to_string(er.retry_after)});
  r.send(er.http_status, "application/json",
         er.body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", headers);
}

// A socket whose reads give up after an idle timeout (Beast's sync read has none of its own).
template <class Socket>
struct TimedStream {
  Socket& sock;
  int timeout_ms;
  using executor_type = typename Socket::executor_type;
  executor_type get_executor() { return sock.get_executor(); }
  template <class Buffers>
  size_t read_some(const Buffers& b, beast::error_code& ec) {
    pollfd p{sock.native_handle(), POLLIN, 0};
    int rc;
    do rc = ::poll(&p, 1, timeout_ms);
    while (rc < 0 && errno == EINTR);
    if (rc == 0) {
      ec = beast::error::timeout;
      return 0;
    }
    return sock.read_some(b, ec);
  }
  template <class Buffers>
  size_t read_some(const Buffers& b) {
    beast::error_code ec;
    size_t n = read_some(b, ec);
    if (ec) throw beast::system_error(ec);
    return n;
  }
  template <class Buffers>
  size_t write_some(const Buffers& b, beast::error_code& ec) { return sock.write_some(b, ec); }
  template <class Buffers>
  size_t write_some(const Buffers& b) { return sock.write_some(b); }
};

template <class Socket>
class Responder final : public HttpResponder {
 public:
  Responder(Socket& s, bool keep_alive) : sock_(s), keep_alive_(keep_alive) {}
  void send(int status, const std::string& content_type, const std::string& body,
            const std::vector<std::pair<std::string, std::string>>& headers) override {
    if (responded_) return;
    responded_ = true;
    http::response<http::string_body> res{static_cast<http::status>(status), 11};
    res.set(http::field::server, "towerd");
    res.set(http::field::content_type, content_type);
    for (const auto& [k, v] : headers) res.set(k, v);
    res.keep_alive(keep_alive_);
    res.body() = body;
    res.prepare_payload();
    beast::error_code ec;
    http::write(sock_, res, ec);
    if (ec) broken_ = true;
  }
  bool start_stream(int status, const std::string& content_type) override {
    if (responded_) return false;
    responded_ = true;
    streaming_ = true;
    http::response<http::empty_body> res{static_cast<http::status>(status), 11};
    res.set(http::field::server, "towerd");
    res.set(http::field::content_type, content_type);
    res.set(http::field::cache_control, "no-cache");
    res.keep_alive(keep_alive_);
    res.chunked(true);
    http::response_serializer<http::empty_body> sr{res};
    beast::error_code ec;
    http::write_header(sock_, sr, ec);
    if (ec) broken_ = true;
    return !broken_;
  }
  bool write_chunk(std::string_view data) override {
    if (broken_) return false;
    beast::error_code ec;
    asio::write(sock_, http::make_chunk(asio::buffer(data.data(), data.size())), ec);
    if (ec) broken_ = true;
    return !broken_;
  }
  void end_stream() override {
    if (broken_) return;
    beast::error_code ec;
    asio::write(sock_, http::make_chunk_last(), ec);
    if (ec) broken_ = true;
  }
  bool client_gone() override {
    if (broken_) return true;
    pollfd p{sock_.native_handle(), POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) broken_ = true;
    return broken_;
  }
  bool responded() const override { return responded_; }
  bool broken() const { return broken_; }

 private:
  Socket& sock_;
  bool keep_alive_;
  bool responded_ = false, streaming_ = false, broken_ = false;
};

}  // namespace

struct HttpServer::Impl {
  HttpServerOptions opt;
  Handler handler;
  HttpServer* owner = nullptr;
  asio::io_context ioc;
  std::unique_ptr<local::acceptor> unix_acc;
  std::unique_ptr<tcp::acceptor> tcp_acc;
  std::vector<std::thread> acceptors;
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable idle;

  bool allowed(int uid, int gid) const {
    if (uid == 0 || uid == static_cast<int>(::getuid())) return true;
    for (uint32_t u : opt.allowed_uids) if (static_cast<int>(u) == uid) return true;
    for (uint32_t g : opt.allowed_gids) if (static_cast<int>(g) == gid) return true;
    return false;
  }

  template <class Socket>
  void serve(Socket sock, int uid, int gid, bool check_creds) {
    TimedStream<Socket> ts{sock, opt.idle_timeout_ms};
    beast::flat_buffer buf;
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(opt.max_body_bytes);
      parser.header_limit(64 * 1024);
      beast::error_code ec;
      http::read(ts, buf, parser, ec);
      if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
          ec == beast::error::timeout) {
        break;
      }
      if (ec) {
        Responder<Socket> r(sock, false);
        if (ec == http::error::body_limit) {
          send_error(r, ApiStatus(Status::ResourceExhausted("request body exceeds limits.max_body_bytes (" +
                                                            std::to_string(opt.max_body_bytes) + " bytes)"),
                                  "", "request_too_large"));
        } else {
          send_error(r, Status::InvalidArgument("malformed HTTP request: " + ec.message()));
        }
        break;
      }
      auto& msg = parser.get();
      HttpRequest req;
      req.method = std::string(msg.method_string());
      req.target = std::string(msg.target());
      auto q = req.target.find('?');
      req.path = req.target.substr(0, q);
      if (q != std::string::npos) req.query = req.target.substr(q + 1);
      req.body = std::move(msg.body());
      req.content_type = std::string(msg[http::field::content_type]);
      req.peer_uid = uid;
      req.peer_gid = gid;
      const bool keep = msg.keep_alive();
      Responder<Socket> r(sock, keep);
      if (check_creds && !allowed(uid, gid)) {
        send_error(r, Status::PermissionDenied("uid " + std::to_string(uid) +
                                               " may not use this daemon (server.allowed_uids/allowed_gids)"));
        log_warn("refused a connection from uid " + std::to_string(uid) + " gid " + std::to_string(gid));
        break;
      }
      try {
        handler(req, r);
      } catch (const std::exception& e) {
        log_error(req.method + " " + req.path + ": internal error: " + e.what());
        if (!r.responded()) send_error(r, Status::Error(std::string("internal error: ") + e.what()));
      }
      if (!r.responded()) send_error(r, Status::Error("the handler sent no response"));
      if (!keep || r.broken()) break;
    }
    beast::error_code ec;
    sock.shutdown(asio::socket_base::shutdown_both, ec);
    sock.close(ec);
  }

  template <class Acceptor, class Socket>
  void accept_loop(Acceptor& acc, bool unix_socket) {
    while (!stop) {
      pollfd p{acc.native_handle(), POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;
      if (stop) break;
      beast::error_code ec;
      Socket sock(ioc);
      acc.accept(sock, ec);
      if (ec) continue;
      int uid = -1, gid = -1;
      if (unix_socket) {
        ucred cred{};
        socklen_t len = sizeof cred;
        if (::getsockopt(sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
          uid = static_cast<int>(cred.uid);
          gid = static_cast<int>(cred.gid);
        }
      }
      if (owner->connections_.load() >= opt.max_connections) {
        Responder<Socket> r(sock, false);
        send_error(r, Status::Unavailable("too many connections (server.max_connections)"));
        continue;
      }
      owner->connections_++;
      std::thread([this, s = std::move(sock), uid, gid, unix_socket]() mutable {
        serve(std::move(s), uid, gid, unix_socket);
        std::lock_guard lock(mu);
        owner->connections_--;
        idle.notify_all();
      }).detach();
    }
  }
};

HttpServer::HttpServer(HttpServerOptions options, Handler handler) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  impl_->handler = std::move(handler);
  impl_->owner = this;
}

HttpServer::~HttpServer() {
  stop_accepting();
  wait_idle(std::chrono::milliseconds(2000));
}

Status HttpServer::start() {
  auto& o = impl_->opt;
  namespace fs = std::filesystem;
  try {
    fs::path sp(o.socket_path);
    std::error_code fec;
    if (!sp.parent_path().empty()) fs::create_directories(sp.parent_path(), fec);
    if (fs::exists(sp, fec)) {
      if (!fs::is_socket(sp, fec)) return Status::Error(o.socket_path + " exists and is not a socket");
      // A live daemon answers; a stale file from a crash does not.
      local::socket probe(impl_->ioc);
      beast::error_code ec;
      probe.connect(local::endpoint(o.socket_path), ec);
      if (!ec) return Status::Error("another daemon is listening on " + o.socket_path);
      fs::remove(sp, fec);
    }
    impl_->unix_acc = std::make_unique<local::acceptor>(impl_->ioc, local::endpoint(o.socket_path));
    if (::chmod(o.socket_path.c_str(), o.socket_mode) != 0) {
      return Status::Error("cannot chmod " + o.socket_path + ": " + std::strerror(errno));
    }
    if (o.socket_gid >= 0 && ::chown(o.socket_path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(o.socket_gid)) != 0) {
      return Status::Error("cannot give " + o.socket_path + " to group " + std::to_string(o.socket_gid) + ": " +
                           std::strerror(errno));
    }
    if (!o.tcp_listen.empty()) {
      auto colon = o.tcp_listen.rfind(':');
      std::string host = o.tcp_listen.substr(0, colon);
      if (host == "localhost") host = "127.0.0.1";
      if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
      const int port = std::stoi(o.tcp_listen.substr(colon + 1));
      tcp::endpoint ep(asio::ip::make_address(host), static_cast<unsigned short>(port));
      impl_->tcp_acc = std::make_unique<tcp::acceptor>(impl_->ioc, ep);
    }
  } catch (const std::exception& e) {
    return Status::Error("cannot listen: " + std::string(e.what()));
  }
  impl_->acceptors.emplace_back([this] { impl_->accept_loop<local::acceptor, local::socket>(*impl_->unix_acc, true); });
  if (impl_->tcp_acc) {
    impl_->acceptors.emplace_back([this] { impl_->accept_loop<tcp::acceptor, tcp::socket>(*impl_->tcp_acc, false); });
  }
  return Status::Ok();
}

void HttpServer::stop_accepting() {
  if (impl_->stop.exchange(true)) return;
  for (auto& t : impl_->acceptors) t.join();
  impl_->acceptors.clear();
  beast::error_code ec;
  if (impl_->unix_acc) {
    impl_->unix_acc->close(ec);
    std::error_code fec;
    std::filesystem::remove(impl_->opt.socket_path, fec);
  }
  if (impl_->tcp_acc) impl_->tcp_acc->close(ec);
}

int HttpServer::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->mu);
  impl_->idle.wait_for(lock, timeout, [&] { return connections_.load() == 0; });
  return connections_.load();
}

}  // namespace towers::daemon
