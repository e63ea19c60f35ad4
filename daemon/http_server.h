// The HTTP/1.1 front: Boost.Beast over a Unix socket (and optionally loopback TCP). One thread per
// connection (a local daemon has tens of clients, and the handlers block on the scheduler), reads
// bounded by a body limit and an idle timeout, keep-alive. Unix-socket peers are checked with
// SO_PEERCRED against the allowed uids/gids; TCP has no peer credentials (any local user can connect,
// which is why it is off by default).
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "engine/status.h"

namespace towers::daemon {

struct HttpRequest {
  std::string method, target, path, query, body;
  std::string content_type;
  int peer_uid = -1, peer_gid = -1;
};

// How a handler answers: one whole response, or a stream (Server-Sent Events) of chunks.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  virtual void send(int status, const std::string& content_type, const std::string& body,
                    const std::vector<std::pair<std::string, std::string>>& headers = {}) = 0;
  virtual bool start_stream(int status, const std::string& content_type) = 0;
  virtual bool write_chunk(std::string_view data) = 0;  // false: the client is gone
  virtual void end_stream() = 0;
  virtual bool client_gone() = 0;  // the peer closed or reset the connection
  virtual bool responded() const = 0;
};

struct HttpServerOptions {
  std::string socket_path;
  unsigned socket_mode = 0660;
  int socket_gid = -1;               // chown the socket to this group (-1: leave)
  std::string tcp_listen;            // "127.0.0.1:8080" or ""
  std::vector<uint32_t> allowed_uids, allowed_gids;
  size_t max_body_bytes = 1 << 20;
  int max_connections = 256;
  int idle_timeout_ms = 60000;
};

class HttpServer {
 public:
  using Handler = std::function<void(const HttpRequest&, HttpResponder&)>;
  HttpServer(HttpServerOptions options, Handler handler);
  ~HttpServer();
  Status start();                    // binds (replacing a stale socket file) and starts accepting
  void stop_accepting();
  // Waits for open connections to finish, up to the timeout; returns how many are left.
  int wait_idle(std::chrono::milliseconds timeout);
  int connections() const { return connections_.load(); }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<int> connections_{0};
};

}  // namespace towers::daemon
