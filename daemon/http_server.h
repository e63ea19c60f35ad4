// The HTTP/1.1 front of towerd: Boost.Asio/Beast, asynchronous, on a Unix socket and optionally one
// loopback TCP port. A small fixed pool of I/O threads runs every connection; a connection costs a
// socket, a buffer and a timer, never a thread, so idle or slow clients cannot use up the daemon.
//
// What a connection may hold, and for how long (docs/http.md has the full story):
//   - a peer is checked at accept time, before anything is read: on the Unix socket SO_PEERCRED's
//     uid and every group of that uid (getgrouplist) against the allowed set (http_guard.h); TCP
//     requests must name a loopback Host, carry no foreign Origin, send JSON bodies and, when an
//     API key is set, the bearer token;
//   - a request header must arrive whole within header_timeout of its first byte (of the accept
//     for a new connection), its body within body_timeout; an idle keep-alive connection closes
//     after idle_timeout;
//   - connections are limited in total and per peer uid (all TCP peers share one bucket); at a
//     limit the oldest idle connection (nothing of a request received) is closed to make room,
//     and if there is none the newcomer's request header is read (bounded, short deadline) and
//     answered 503 + Retry-After, so the client sees an answer instead of a reset;
//   - the total is lowered to fit the open-file limit, and when accept still runs out of file
//     descriptors it closes an idle connection or pauses (never spins).
//
// The handler contract: handler(request, responder) runs on an I/O thread and must not block. It
// answers through the responder, now or later, from any thread (the scheduler streams tokens
// straight into it). While a response is being produced the connection keeps a read pending, so a
// client that disconnects is seen at once: on_close callbacks run then, which is how a generation
// is cancelled. No pipelining: bytes of a next request wait until the response is complete.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/base/status.h"

namespace towers::daemon {

struct HttpRequest {
  std::string method, target, path, query, body;
  std::string content_type;
  int peer_uid = -1, peer_gid = -1;  // Unix socket peers (SO_PEERCRED); -1 over TCP
  bool tcp = false;
};

// How a handler answers: one whole response, or a stream (Server-Sent Events) of chunks. Every
// method is thread-safe and non-blocking: bytes are queued for the connection's I/O thread. The
// first of send/start_stream wins; later ones are ignored (send) or return false. The server owns
// every responder through a shared_ptr: code that answers later keeps shared_from_this().
class HttpResponder : public std::enable_shared_from_this<HttpResponder> {
 public:
  using Headers = std::vector<std::pair<std::string, std::string>>;
  virtual ~HttpResponder() = default;
  virtual void send(int status, std::string_view content_type, std::string body, const Headers& headers = {}) = 0;
  virtual bool start_stream(int status, std::string_view content_type) = 0;
  // false: the client is gone, or it stopped reading and more than the connection's queue limit
  // of streamed bytes piled up (it is then dropped).
  virtual bool write_chunk(std::string_view data) = 0;
  virtual void end_stream() = 0;
  // The connection closed, or its peer hung up (seen on the socket itself, before the I/O thread
  // reads the end): cheap and non-blocking, the scheduler asks before every step.
  virtual bool client_gone() const = 0;
  virtual bool responded() const = 0;  // send or start_stream was called
  // fn runs once, on an I/O thread, if the connection closes before the response is complete
  // (send, or end_stream, called); at once on the caller's thread if it is already closed. It must
  // not block (set a flag). Not run when the response completes.
  virtual void on_close(std::function<void()> fn) = 0;
};

struct HttpServerOptions {
  std::string socket_path;
  unsigned socket_mode = 0660;
  int socket_gid = -1;                 // chown the socket to this group (-1: leave the daemon's)
  std::string tcp_host;                // loopback address to listen on ("" = no TCP)
  uint16_t tcp_port = 0;
  std::vector<uint32_t> allowed_uids, allowed_gids;
  std::vector<std::string> allowed_origins;  // TCP: Origin values accepted ("http://localhost:3000")
  std::string api_key;                 // TCP: required bearer token ("" = none)
  size_t max_body_bytes = 1 << 20;
  int io_threads = 2;
  int max_connections = 256;
  int max_connections_per_uid = 64;    // also the cap of all TCP peers together
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds body_timeout{30000};
  std::chrono::milliseconds idle_timeout{60000};
  // Observes every answered request: (method, path, status, seconds from its header to its last
  // byte queued). Runs on whichever thread completed the response.
  std::function<void(std::string_view method, std::string_view path, int status, double seconds)> on_response;
};

// Counters of the edge, for /metrics.
struct HttpServerStats {
  int open = 0;                 // connections admitted and not closed
  int limit = 0;                // the total connection limit in force (after the open-file limit)
  uint64_t accepted = 0;        // sockets accepted (including refused ones)
  uint64_t refused_peer = 0;    // uid/groups not allowed
  uint64_t refused_limit = 0;   // over a connection limit, nothing idle to close
  uint64_t reclaimed = 0;       // idle connections closed to make room
  uint64_t header_timeouts = 0, body_timeouts = 0, idle_timeouts = 0;
  uint64_t dropped_slow_readers = 0;  // queue limit or send deadline passed
  uint64_t client_disconnects = 0;    // peer gone while its response was being produced
  uint64_t fd_exhausted = 0;    // accepts that failed for want of file descriptors
};

class HttpServer {
 public:
  using Handler = std::function<void(const HttpRequest&, std::shared_ptr<HttpResponder>)>;
  HttpServer(HttpServerOptions options, Handler handler);
  ~HttpServer();  // stops the I/O threads; open connections are closed
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  Status start();  // binds (replacing a stale socket file), starts the I/O threads and accepting
  // Stops accepting and removes the socket file; idle connections close now, the others after their
  // current response.
  void stop_accepting();
  // Waits for open connections to finish, up to the timeout; returns how many are left.
  int wait_idle(std::chrono::milliseconds timeout);
  HttpServerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace towers::daemon
