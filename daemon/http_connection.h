// One HTTP connection of towerd's server (daemon/http_server.h says what a connection may hold; this
// is how). Internal to the server: http_server.cc accepts and admits, this runs the connection.
//
// Everything of a connection runs on its strand, with one read loop and one deadline timer:
//   Await   waiting for a request's first byte (idle_timeout; a new connection: header_timeout)
//   Header  bytes fed to Beast's parser until the header is whole (header_timeout from its first byte)
//   Body    the body (body_timeout); "Expect: 100-continue" is answered before reading it
//   Respond the handler's response is produced; the read loop stays armed only to see a disconnect;
//           the timer is the send deadline of a write that does not progress
//   Refuse  a refused or over-limit peer: its request header is read (8 KiB, 2 s) and answered
//   Linger  after a final answer: write side shut, input drained (bounded) until EOF, so the client
//           reads the answer instead of a reset
// Responses are queued by Exchange (the HttpResponder a handler gets) from any thread under out_mu_
// and written by the strand.
#pragma once
#include <array>
#include <atomic>
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "daemon/api_error.h"
#include "daemon/http_guard.h"
#include "daemon/http_server.h"

namespace towers::daemon::http_detail {

namespace asio = boost::asio;
using Socket = asio::generic::stream_protocol::socket;
using Clock = std::chrono::steady_clock;

enum class Phase : int { Await, Header, Body, Respond, Refuse, Linger, Closed };
// The answer to the current request: none yet, a whole one, a stream under way, all of it queued.
enum class Out { Idle, Pending, Streaming, Complete };

class Connection;

// What a connection shares with its server. Counters are the server's HttpServerStats.
struct Edge {
  HttpServerOptions options;
  HttpServer::Handler handler;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> header_timeouts{0}, body_timeouts{0}, idle_timeouts{0}, dropped_slow_readers{0},
      client_disconnects{0};
  // Called on the connection's strand once it is closed; and when it has answered for the last
  // time (false: too many linger already, close at once).
  std::function<void(Connection*)> closed;
  std::function<bool(Connection*)> lingering;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Socket socket, std::shared_ptr<Edge> edge, bool tcp, int uid, int gid);
  // On the strand (posted by the server): start serving, or start a refusal.
  void start();
  void start_refusal(ApiStatus why);  // the answer it gets once its header is in
  // Any thread: close now (server stop, room needed for a new connection).
  void close_async();
  // Any thread: close if idle, else after the current response (server stop).
  void stop_async();

  Socket::executor_type executor() { return socket_.get_executor(); }
  Phase phase() const { return phase_.load(); }
  Clock::time_point phase_since() const { return Clock::time_point(Clock::duration(phase_since_.load())); }
  int uid() const { return uid_; }
  bool tcp() const { return tcp_; }

  // The Exchange's side (any thread). seq names the request; calls for an old one do nothing.
  enum class Part { Whole, StreamHead, Chunk, StreamEnd };
  bool queue(uint64_t seq, Part part, std::string bytes, int status = 0);
  void watch_close(uint64_t seq, std::function<void()> fn);
  void abandoned(uint64_t seq);  // the handler dropped its responder
  // Closed, or the peer hung up even if the I/O thread has not read its end yet (a look at the
  // socket: the scheduler asks before every step, so a disconnect is seen within one step however
  // busy the I/O threads are).
  bool gone(uint64_t seq) const;

 private:
  void set_phase(Phase p);
  void arm(std::chrono::milliseconds d);
  void disarm();
  void on_deadline();
  void read_some();
  void on_read(boost::system::error_code ec, size_t n);
  void parse();
  void header_done();
  void dispatch();
  void refuse_now();
  void answer_and_close(const ApiStatus& why);
  // A final answer (whole response bytes) that closes the connection; status for the metrics.
  void answer_bytes_and_close(int status, std::string bytes);
  ApiStatus too_large() const;
  void flush();
  void on_written(boost::system::error_code ec, size_t n);
  void response_complete();
  void linger();
  void close(bool disconnected);
  void new_parser(size_t header_limit);

  Socket socket_;
  const int fd_;  // socket_'s, for gone(): valid until close() (which sets closed_ first)
  asio::steady_timer timer_;
  std::shared_ptr<Edge> edge_;
  const bool tcp_;
  const int uid_, gid_;
  std::atomic<Phase> phase_{Phase::Await};
  std::atomic<int64_t> phase_since_{0};
  uint64_t timer_gen_ = 0;
  bool reading_ = false, writing_ = false, first_request_ = true;
  boost::beast::flat_buffer in_;
  std::array<char, 16 * 1024> read_buf_;  // where the one outstanding read lands (then appended to in_)
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  ApiStatus refused_;
  std::string cors_origin_;  // TCP: the request's Origin when it is allowed (its replies name it)
  size_t lingered_ = 0;
  Clock::time_point request_start_;

  // Shared with Exchange (any thread).
  mutable std::mutex out_mu_;
  std::deque<std::string> outbox_;
  std::deque<std::string> in_flight_;  // being written (strand)
  size_t queued_bytes_ = 0;
  bool flush_posted_ = false;
  bool closed_ = false;
  // gone() saw the peer hang up while a response was being produced: counted there once, so that a
  // generation cancelled (and finished) before the read side sees the EOF is still counted.
  mutable bool counted_disconnect_ = false;
  uint64_t seq_ = 0;                  // current request
  Out out_ = Out::Idle;
  bool keep_alive_ = false, must_close_ = false;
  int status_ = 0;
  std::string method_, path_;
  std::vector<std::function<void()>> on_close_;
};

// The HttpResponder of one request: a handle on its connection.
class Exchange final : public HttpResponder {
 public:
  // What the request allows: keep-alive, chunked streams (HTTP/1.1; a 1.0 client gets the stream
  // delimited by the close), a body (not for HEAD).
  struct Framing {
    bool keep_alive = true, chunked = true, body = true;
    std::string cors_origin;  // non-empty: the reply carries Access-Control-Allow-Origin for it
  };
  Exchange(std::weak_ptr<Connection> c, uint64_t seq, Framing f) : conn_(std::move(c)), seq_(seq), framing_(f) {}
  ~Exchange() override;
  void send(int status, std::string_view content_type, std::string body, const Headers& headers) override;
  bool start_stream(int status, std::string_view content_type) override;
  bool write_chunk(std::string_view data) override;
  void end_stream() override;
  bool client_gone() const override;
  bool responded() const override { return responded_.load(); }
  void on_close(std::function<void()> fn) override;

 private:
  std::weak_ptr<Connection> conn_;
  const uint64_t seq_;
  const Framing framing_;
  std::atomic<bool> responded_{false}, done_{false};
};

// "HTTP/1.1 503 Service Unavailable\r\n..." through the blank line. content_length: the body's
// size, or kChunked, or kUntilClose (the body ends when the connection closes).
constexpr long kChunked = -1, kUntilClose = -2;
std::string response_head(int status, std::string_view content_type, bool keep_alive, long content_length,
                          const HttpResponder::Headers& headers = {});
// A whole error response (daemon/api_error.h's mapping), closing the connection.
std::string error_response(const ApiStatus& e, const HttpResponder::Headers& extra = {});

}  // namespace towers::daemon::http_detail
