#include "daemon/http_connection.h"

#include <poll.h>

#include <boost/beast/http/error.hpp>
#include <boost/beast/http/status.hpp>
#include <nlohmann/json.hpp>

#include "daemon/log.h"

namespace towers::daemon::http_detail {

namespace http = boost::beast::http;
using boost::system::error_code;

namespace {

constexpr size_t kHeaderLimit = 64 * 1024;
constexpr size_t kRefusalHeaderLimit = 8 * 1024;     // a refused peer's header: enough for a request line
constexpr auto kRefusalTimeout = std::chrono::milliseconds(2000);
constexpr auto kLingerTimeout = std::chrono::milliseconds(2000);
constexpr size_t kLingerBytes = 1 << 20;             // input drained after a final answer, at most
constexpr size_t kMaxPendingInput = 64 * 1024;       // bytes of a next request kept while responding
constexpr size_t kMaxQueuedStream = 4 << 20;         // streamed bytes a client may leave unread
constexpr auto kSendTimeout = std::chrono::milliseconds(30000);  // a write that makes no progress

std::string clean(std::string_view s) {  // header text: no CR/LF smuggled in by a caller
  std::string out;
  for (char c : s) {
    if (c != '\r' && c != '\n') out += c;
  }
  return out;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view sv(boost::beast::string_view s) { return {s.data(), s.size()}; }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

std::string response_head(int status, std::string_view content_type, bool keep_alive, long content_length,
                          const HttpResponder::Headers& headers) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " +
                  std::string(http::obsolete_reason(static_cast<http::status>(status))) + "\r\nServer: towerd\r\n";
  if (!content_type.empty()) h += "Content-Type: " + clean(content_type) + "\r\n";
  if (content_length >= 0) h += "Content-Length: " + std::to_string(content_length) + "\r\n";
  else h += content_length == kChunked ? "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n" : "Cache-Control: no-cache\r\n";
  h += keep_alive && content_length != kUntilClose ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& [k, v] : headers) h += clean(k) + ": " + clean(v) + "\r\n";
  h += "\r\n";
  return h;
}

std::string error_response(const ApiStatus& e, const HttpResponder::Headers& extra) {
  const ErrorReply r = error_reply(e);
  HttpResponder::Headers headers = extra;
  if (r.retry_after > 0) headers.emplace_back("Retry-After", std::to_string(r.retry_after));
  if (r.http_status == 401) headers.emplace_back("WWW-Authenticate", "Bearer");
  const std::string body = r.body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  return response_head(r.http_status, "application/json", false, static_cast<long>(body.size()), headers) + body;
}

// ---- Connection: strand side ----

Connection::Connection(Socket socket, std::shared_ptr<Edge> edge, bool tcp, int uid, int gid)
    : socket_(std::move(socket)), fd_(socket_.native_handle()), timer_(socket_.get_executor()), edge_(std::move(edge)), tcp_(tcp), uid_(uid), gid_(gid) {
  phase_since_ = Clock::now().time_since_epoch().count();
}

void Connection::set_phase(Phase p) {
  phase_ = p;
  phase_since_ = Clock::now().time_since_epoch().count();
}

void Connection::arm(std::chrono::milliseconds d) {
  timer_.expires_after(d);
  const uint64_t gen = ++timer_gen_;
  timer_.async_wait([self = shared_from_this(), gen](error_code ec) {
    if (!ec && gen == self->timer_gen_) self->on_deadline();
  });
}

void Connection::disarm() {
  ++timer_gen_;
  timer_.cancel();
}

void Connection::new_parser(size_t header_limit) {
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(header_limit));
  parser_->body_limit(edge_->options.max_body_bytes);
}

void Connection::start() {
  new_parser(kHeaderLimit);
  set_phase(Phase::Await);
  arm(edge_->options.header_timeout);  // a new connection: its first header is due from the accept
  read_some();
}

void Connection::start_refusal(ApiStatus why) {
  refused_ = std::move(why);
  new_parser(kRefusalHeaderLimit);
  set_phase(Phase::Refuse);
  arm(kRefusalTimeout);
  read_some();
}

void Connection::close_async() {
  asio::post(socket_.get_executor(), [self = shared_from_this()] { self->close(false); });
}

void Connection::stop_async() {
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    const Phase p = self->phase_;
    if (p == Phase::Await || p == Phase::Header || p == Phase::Body) self->close(false);
  });
}

void Connection::on_deadline() {
  switch (phase_.load()) {
    case Phase::Await:
      (first_request_ ? edge_->header_timeouts : edge_->idle_timeouts)++;
      return close(false);
    case Phase::Header:
      edge_->header_timeouts++;
      return close(false);
    case Phase::Body:
      edge_->body_timeouts++;
      return answer_and_close(ApiStatus(
          Status::InvalidArgument("the request body did not arrive within server.body_timeout_seconds"), "",
          "request_timeout"));
    case Phase::Respond:  // a write made no progress: the client stopped reading
      edge_->dropped_slow_readers++;
      log_debug("dropped a connection whose client stopped reading");
      return close(true);
    case Phase::Refuse: return refuse_now();
    case Phase::Linger: return close(false);
    case Phase::Closed: return;
  }
}

void Connection::read_some() {
  if (reading_ || phase_ == Phase::Closed) return;
  if (phase_ == Phase::Respond && in_.size() >= kMaxPendingInput) return;  // writes still see a disconnect
  reading_ = true;
  // Into a buffer of its own, not in_.prepare(): a read stays outstanding while a response is produced
  // and in_ is parsed and consumed meanwhile (a consume that empties a flat_buffer moves its write
  // position), so a region prepared before would be committed at the wrong place: the next request's
  // bytes lost, stale ones parsed instead.
  socket_.async_read_some(asio::buffer(read_buf_),
                          [self = shared_from_this()](error_code ec, size_t n) { self->on_read(ec, n); });
}

void Connection::on_read(error_code ec, size_t n) {
  reading_ = false;
  if (phase_ == Phase::Closed) return;
  if (ec) return close(phase_ == Phase::Respond);  // EOF or reset: the client is gone
  in_.commit(asio::buffer_copy(in_.prepare(n), asio::buffer(read_buf_.data(), n)));
  switch (phase_.load()) {
    case Phase::Await:
      set_phase(Phase::Header);
      if (!first_request_) arm(edge_->options.header_timeout);
      return parse();
    case Phase::Header:
    case Phase::Body:
    case Phase::Refuse: return parse();
    case Phase::Respond: return read_some();  // a next request waits (no pipelining)
    case Phase::Linger:
      lingered_ += in_.size();
      in_.consume(in_.size());
      if (lingered_ > kLingerBytes) return close(false);
      return read_some();
    case Phase::Closed: return;
  }
}

void Connection::parse() {
  error_code ec;
  while (in_.size() > 0 && !parser_->is_done()) {
    const size_t used = parser_->put(in_.data(), ec);
    in_.consume(used);
    if (ec == http::error::need_more) {
      ec = {};
      break;
    }
    if (ec) break;
    if (!parser_->is_header_done()) continue;
    if (phase_ == Phase::Refuse) return refuse_now();
    if (phase_ == Phase::Header) {
      header_done();
      if (phase_ != Phase::Body) return;  // answered already
    }
  }
  if (phase_ == Phase::Refuse) {
    if (ec) return refuse_now();
    return read_some();
  }
  if (ec == http::error::body_limit) return answer_and_close(too_large());
  if (ec == http::error::header_limit) {
    return answer_and_close(
        ApiStatus(Status::InvalidArgument("request header larger than 64 KiB"), "", "request_header_too_large"));
  }
  if (ec) return answer_and_close(Status::InvalidArgument("malformed HTTP request: " + ec.message()));
  if (parser_->is_done()) return dispatch();
  read_some();
}

void Connection::header_done() {
  request_start_ = Clock::now();
  const auto& req = parser_->get();
  const auto length = parser_->content_length();
  const bool has_body = parser_->chunked() || (length && *length > 0);
  {
    std::lock_guard lock(out_mu_);
    method_ = std::string(req.method_string());
    path_ = std::string(req.target().substr(0, req.target().find('?')));
  }
  cors_origin_.clear();
  if (tcp_) {
    const std::string_view origin = sv(req[http::field::origin]);
    const bool allowed = !origin.empty() && is_loopback_host(sv(req[http::field::host])) &&
                         origin_allowed(origin, edge_->options.allowed_origins);
    if (allowed) cors_origin_ = clean(origin);
    if (allowed && req.method() == http::verb::options && req.count(http::field::access_control_request_method)) {
      const auto headers = cors_preflight_headers(cors_origin_, sv(req[http::field::access_control_request_headers]));
      return answer_bytes_and_close(204, response_head(204, "", false, 0, headers));
    }
    TcpRequestView v{sv(req.method_string()), sv(req[http::field::host]), origin,
                     sv(req[http::field::authorization]), sv(req[http::field::content_type]), has_body};
    if (ApiStatus r = check_tcp_request(v, edge_->options.allowed_origins, edge_->options.api_key); !r.ok()) {
      return answer_and_close(r);
    }
  }
  if (length && *length > edge_->options.max_body_bytes) return answer_and_close(too_large());
  set_phase(Phase::Body);
  arm(edge_->options.body_timeout);
  parser_->eager(true);
  if (has_body && iequals(sv(req[http::field::expect]), "100-continue") && in_.size() == 0) {
    {
      std::lock_guard lock(out_mu_);
      outbox_.push_back("HTTP/1.1 100 Continue\r\n\r\n");
    }
    flush();
  }
}

void Connection::dispatch() {
  set_phase(Phase::Respond);
  disarm();
  auto msg = parser_->release();
  parser_.reset();
  HttpRequest req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  const auto q = req.target.find('?');
  req.path = req.target.substr(0, q);
  if (q != std::string::npos) req.query = req.target.substr(q + 1);
  req.body = std::move(msg.body());
  req.content_type = std::string(msg[http::field::content_type]);
  req.peer_uid = uid_;
  req.peer_gid = gid_;
  req.tcp = tcp_;
  const bool http11 = msg.version() >= 11;  // 1.0: no chunks, no keep-alive
  const Exchange::Framing framing{msg.keep_alive() && http11 && !edge_->stopping, http11,
                                  msg.method() != http::verb::head, cors_origin_};
  const bool keep_alive = framing.keep_alive;
  uint64_t seq;
  {
    std::lock_guard lock(out_mu_);
    seq = ++seq_;
    out_ = Out::Pending;
    keep_alive_ = keep_alive;
    must_close_ = false;
    status_ = 0;
    on_close_.clear();
  }
  read_some();  // sees a disconnect while the response is produced
  auto ex = std::make_shared<Exchange>(weak_from_this(), seq, framing);
  try {
    edge_->handler(req, ex);
  } catch (const std::exception& e) {
    log_error(req.method + " " + req.path + ": internal error: " + e.what());
    if (!ex->responded()) {
      const ErrorReply r = error_reply(Status::Error(std::string("internal error: ") + e.what()));
      ex->send(r.http_status, "application/json", r.body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", {});
    }
  }
}

void Connection::refuse_now() { answer_and_close(refused_); }

ApiStatus Connection::too_large() const {
  return ApiStatus(Status::ResourceExhausted("request body exceeds limits.max_body_bytes (" +
                                             std::to_string(edge_->options.max_body_bytes) + " bytes)"),
                   "", "request_too_large");
}

void Connection::answer_and_close(const ApiStatus& why) {
  const HttpResponder::Headers cors = cors_origin_.empty() ? HttpResponder::Headers{} : cors_reply_headers(cors_origin_);
  answer_bytes_and_close(error_reply(why).http_status, error_response(why, cors));
}

void Connection::answer_bytes_and_close(int status, std::string bytes) {
  const bool counted = phase_ != Phase::Refuse;  // a refused peer's request is not a served request
  set_phase(Phase::Respond);
  disarm();
  std::string method, path;
  {
    std::lock_guard lock(out_mu_);
    ++seq_;
    out_ = Out::Complete;
    must_close_ = true;
    keep_alive_ = false;
    queued_bytes_ += bytes.size();
    outbox_.push_back(std::move(bytes));
    method = method_;
    path = path_;
  }
  if (counted && edge_->options.on_response) {
    edge_->options.on_response(method, path, status, parser_ && parser_->is_header_done() ? seconds_since(request_start_) : 0);
  }
  flush();
}

void Connection::flush() {
  if (writing_ || phase_ == Phase::Closed) return;
  {
    std::lock_guard lock(out_mu_);
    flush_posted_ = false;
    if (outbox_.empty()) return;
    in_flight_.swap(outbox_);  // a deque swap keeps the strings (and their bytes) in place
  }
  std::vector<asio::const_buffer> bufs;
  bufs.reserve(in_flight_.size());
  for (const auto& s : in_flight_) bufs.emplace_back(s.data(), s.size());
  writing_ = true;
  if (phase_ == Phase::Respond) arm(kSendTimeout);
  asio::async_write(socket_, bufs, [self = shared_from_this()](error_code ec, size_t n) { self->on_written(ec, n); });
}

void Connection::on_written(error_code ec, size_t n) {
  writing_ = false;
  in_flight_.clear();
  bool more = false, done = false;
  {
    std::lock_guard lock(out_mu_);
    queued_bytes_ -= std::min(queued_bytes_, n);
    more = !outbox_.empty();
    done = out_ == Out::Complete && !more;
  }
  if (phase_ == Phase::Closed) return;
  if (ec) return close(true);
  if (more) return flush();
  if (phase_ == Phase::Respond) disarm();
  if (done) response_complete();
}

void Connection::response_complete() {
  bool close_after;
  {
    std::lock_guard lock(out_mu_);
    out_ = Out::Idle;
    close_after = must_close_ || !keep_alive_;
  }
  if (close_after || edge_->stopping) return linger();
  first_request_ = false;
  new_parser(kHeaderLimit);
  if (in_.size() > 0) {  // the next request arrived while this one was answered
    set_phase(Phase::Header);
    arm(edge_->options.header_timeout);
    return parse();
  }
  set_phase(Phase::Await);
  arm(edge_->options.idle_timeout);
  read_some();
}

void Connection::linger() {
  if (!edge_->lingering || !edge_->lingering(this)) return close(false);
  set_phase(Phase::Linger);
  error_code ec;
  socket_.shutdown(asio::socket_base::shutdown_send, ec);
  if (ec) return close(false);
  in_.consume(in_.size());
  lingered_ = 0;
  arm(kLingerTimeout);
  read_some();
}

void Connection::close(bool disconnected) {
  if (phase_ == Phase::Closed) return;
  set_phase(Phase::Closed);
  disarm();
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard lock(out_mu_);
    closed_ = true;
    if (out_ == Out::Pending || out_ == Out::Streaming) {
      callbacks.swap(on_close_);
      if (disconnected && !counted_disconnect_) edge_->client_disconnects++;
    }
    on_close_.clear();
    outbox_.clear();
  }
  error_code ec;
  socket_.close(ec);
  for (auto& f : callbacks) f();
  if (edge_->closed) edge_->closed(this);
}

// ---- Connection: the Exchange's side (any thread) ----

bool Connection::queue(uint64_t seq, Part part, std::string bytes, int status) {
  bool post = false, completed = false, drop = false;
  std::string method, path;
  int answered = 0;
  {
    std::lock_guard lock(out_mu_);
    if (closed_ || seq != seq_) return false;
    switch (part) {
      case Part::Whole:
      case Part::StreamHead:
        if (out_ != Out::Pending) return false;
        out_ = part == Part::Whole ? Out::Complete : Out::Streaming;
        status_ = status;
        break;
      case Part::Chunk:
        if (out_ != Out::Streaming) return false;
        if (queued_bytes_ + bytes.size() > kMaxQueuedStream) {
          drop = true;
          closed_ = true;  // from now on, for the responder: gone; close() fires on_close
          break;
        }
        break;
      case Part::StreamEnd:
        if (out_ != Out::Streaming) return false;
        out_ = Out::Complete;
        break;
    }
    if (!drop) {
      completed = out_ == Out::Complete;
      if (completed) on_close_.clear();
      queued_bytes_ += bytes.size();
      outbox_.push_back(std::move(bytes));
      if (!flush_posted_) flush_posted_ = post = true;
      method = method_;
      path = path_;
      answered = status_;
    }
  }
  if (drop) {
    edge_->dropped_slow_readers++;
    log_debug("dropped a connection whose client stopped reading its stream");
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->close(true); });
    return false;
  }
  if (completed && edge_->options.on_response) {
    edge_->options.on_response(method, path, answered, seconds_since(request_start_));
  }
  if (post) asio::post(socket_.get_executor(), [self = shared_from_this()] { self->flush(); });
  return true;
}

void Connection::watch_close(uint64_t seq, std::function<void()> fn) {
  bool run_now = false;
  {
    std::lock_guard lock(out_mu_);
    if (seq != seq_ || !(out_ == Out::Pending || out_ == Out::Streaming)) return;  // answered: never fires
    if (closed_) run_now = true;
    else on_close_.push_back(std::move(fn));
  }
  if (run_now) fn();
}

void Connection::abandoned(uint64_t seq) {
  bool post = false;
  {
    std::lock_guard lock(out_mu_);
    if (closed_ || seq != seq_) return;
    if (out_ == Out::Pending) {
      outbox_.push_back(error_response(Status::Error("the request produced no response")));
      status_ = 500;
    } else if (out_ != Out::Streaming) {
      return;  // answered
    }
    log_warn(method_ + " " + path_ + ": the handler dropped its response unfinished");
    out_ = Out::Complete;  // a stream cut short: closed without its last chunk, so the client sees it
    must_close_ = true;
    on_close_.clear();
    if (!flush_posted_) flush_posted_ = post = true;
  }
  if (post) asio::post(socket_.get_executor(), [self = shared_from_this()] { self->flush(); });
}

bool Connection::gone(uint64_t) const {
  std::lock_guard lock(out_mu_);
  if (closed_) return true;
  pollfd p{fd_, POLLRDHUP, 0};
  const bool hung_up = ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  if (hung_up && !counted_disconnect_ && (out_ == Out::Pending || out_ == Out::Streaming)) {
    counted_disconnect_ = true;
    edge_->client_disconnects++;
  }
  return hung_up;
}

// ---- Exchange ----

Exchange::~Exchange() {
  if (auto c = conn_.lock()) c->abandoned(seq_);
}

void Exchange::send(int status, std::string_view content_type, std::string body, const Headers& headers) {
  if (responded_.exchange(true)) return;
  done_ = true;
  auto c = conn_.lock();
  if (!c) return;
  Headers all = headers;
  if (!framing_.cors_origin.empty())
    for (auto& h : cors_reply_headers(framing_.cors_origin)) all.push_back(std::move(h));
  std::string bytes =
      response_head(status, content_type, framing_.keep_alive, static_cast<long>(body.size()), all);
  if (framing_.body) bytes += body;
  c->queue(seq_, Connection::Part::Whole, std::move(bytes), status);
}

bool Exchange::start_stream(int status, std::string_view content_type) {
  if (responded_.exchange(true)) return false;
  auto c = conn_.lock();
  const Headers cors = framing_.cors_origin.empty() ? Headers{} : cors_reply_headers(framing_.cors_origin);
  return c && c->queue(seq_, Connection::Part::StreamHead,
                       response_head(status, content_type, framing_.keep_alive,
                                     framing_.chunked ? kChunked : kUntilClose, cors),
                       status);
}

bool Exchange::write_chunk(std::string_view data) {
  auto c = conn_.lock();
  if (!c || !responded_) return false;
  if (data.empty()) return !c->gone(seq_);  // an empty chunk would end the stream
  if (!framing_.body) return true;
  if (!framing_.chunked) return c->queue(seq_, Connection::Part::Chunk, std::string(data));
  char size[20];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string bytes = size;
  bytes.append(data);
  bytes += "\r\n";
  return c->queue(seq_, Connection::Part::Chunk, std::move(bytes));
}

void Exchange::end_stream() {
  if (!responded_ || done_.exchange(true)) return;
  if (auto c = conn_.lock()) {
    c->queue(seq_, Connection::Part::StreamEnd, framing_.chunked && framing_.body ? "0\r\n\r\n" : "");
  }
}

bool Exchange::client_gone() const {
  auto c = conn_.lock();
  return !c || c->gone(seq_);
}

void Exchange::on_close(std::function<void()> fn) {
  if (done_) return;
  auto c = conn_.lock();
  if (!c) return fn();
  c->watch_close(seq_, std::move(fn));
}

}  // namespace towers::daemon::http_detail
