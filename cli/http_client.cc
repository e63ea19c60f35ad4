// HttpClient over Boost.Beast: every step is an asynchronous operation run on a private io_context
// for at most the timeout, so a daemon that hangs cannot hang towerctl.
#include "cli/http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <limits>
#include <optional>

namespace towers::cli {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using boost::system::error_code;
using Socket = asio::local::stream_protocol::socket;

namespace {

// Runs one asynchronous operation started by `start(handler)` to completion or the timeout. Other
// handlers (the SIGINT watch) run meanwhile, so this waits for the operation's own completion.
template <class Start>
error_code run_op(asio::io_context& ioc, Socket& sock, double timeout_s, const char* what, Start start) {
  std::optional<error_code> result;
  start([&result](error_code ec, auto&&...) { result = ec; });
  ioc.restart();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(timeout_s));
  while (!result && (timeout_s > 0 ? ioc.run_one_until(deadline) : ioc.run_one()) > 0) {
  }
  if (!result) {
    error_code ignored;
    sock.cancel(ignored);
    ioc.restart();
    while (!result && ioc.run_one() > 0) {
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", timeout_s);
    throw ClientError(std::string("towerd did not answer (") + what + ") within " + buf + " s (--timeout)");
  }
  return *result;
}

std::string connect_error(const std::string& path, const error_code& ec) {
  std::string hint = " — is towerd running? (--socket / TOWERD_SOCKET)";
  if (ec.value() == EACCES || ec.value() == EPERM) {
    hint = " — is your user allowed to use it? (the socket's group, server.socket_group / allowed_uids)";
  }
  return "cannot connect to " + path + ": " + std::strerror(ec.value()) + hint;
}

}  // namespace

HttpReply HttpClient::stream(const std::string& method, const std::string& target, const std::string& body,
                             const std::function<void(std::string_view)>& on_data) {
  asio::io_context ioc;
  Socket sock(ioc);
  HttpReply reply;
  std::optional<asio::signal_set> sigint;
  if (sigint_) {
    sigint.emplace(ioc, SIGINT);
    sigint->async_wait([&](error_code ec, int) {
      if (ec) return;  // operation_aborted: the request ended first
      reply.interrupted = true;
      error_code ignored;
      sock.close(ignored);  // the pending step fails; towerd sees the client go and cancels
    });
  }
  error_code ec = run_op(ioc, sock, timeout_s_, "connect", [&](auto h) {
    sock.async_connect(asio::local::stream_protocol::endpoint(socket_), h);
  });
  if (reply.interrupted) return reply;
  if (ec) throw ClientError(connect_error(socket_, ec));

  http::request<http::string_body> req(http::string_to_verb(method), target, 11);
  req.set(http::field::host, "localhost");
  req.set(http::field::user_agent, "towerctl");
  req.set(http::field::connection, "close");
  if (!body.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  ec = run_op(ioc, sock, timeout_s_, "sending the request", [&](auto h) { http::async_write(sock, req, h); });
  if (reply.interrupted) return reply;
  if (ec) throw ClientError("cannot send the request to " + socket_ + ": " + ec.message());

  boost::beast::flat_buffer buf;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());  // (boost::none trips a 1.74 bug)
  ec = run_op(ioc, sock, timeout_s_, "waiting for the reply", [&](auto h) { http::async_read_header(sock, buf, parser, h); });
  if (reply.interrupted) return reply;
  if (ec) throw ClientError("no reply from towerd on " + socket_ + ": " + ec.message());

  reply.status = static_cast<int>(parser.get().result_int());
  reply.content_type = std::string(parser.get()[http::field::content_type]);
  reply.retry_after = std::string(parser.get()[http::field::retry_after]);
  const bool events = on_data && reply.content_type.rfind("text/event-stream", 0) == 0;
  SseParser sse(on_data ? on_data : [](std::string_view) {});
  char chunk[8192];
  while (!parser.is_done()) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof chunk;
    ec = run_op(ioc, sock, timeout_s_, "reading the reply", [&](auto h) { http::async_read_some(sock, buf, parser, h); });
    if (reply.interrupted) return reply;
    if (ec == http::error::need_buffer) ec = {};
    if (ec) throw ClientError("the reply from towerd broke off: " + ec.message());
    const size_t n = sizeof chunk - parser.get().body().size;
    if (events) sse.feed(std::string_view(chunk, n));
    else reply.body.append(chunk, n);
  }
  if (events) {
    sse.finish();
    reply.stream_done = sse.done();
  }
  error_code ignored;
  sock.shutdown(Socket::shutdown_both, ignored);
  return reply;
}

void SseParser::feed(std::string_view bytes) {
  partial_.append(bytes);
  size_t at = 0;
  for (size_t nl; (nl = partial_.find('\n', at)) != std::string::npos; at = nl + 1) {
    std::string_view l(partial_.data() + at, nl - at);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    line(l);
  }
  partial_.erase(0, at);
}

void SseParser::finish() {
  if (!partial_.empty()) line(partial_);
  partial_.clear();
  line("");
}

void SseParser::line(std::string_view l) {
  if (l.empty()) {  // end of an event
    if (has_data_) {
      if (data_ == "[DONE]") done_ = true;
      else if (!done_) on_data_(data_);
    }
    data_.clear();
    has_data_ = false;
    return;
  }
  if (l.rfind("data:", 0) != 0) return;  // comments (":"), event:, id:, retry: are not used by towerd
  l.remove_prefix(5);
  if (!l.empty() && l.front() == ' ') l.remove_prefix(1);
  if (has_data_) data_ += '\n';
  data_.append(l);
  has_data_ = true;
}

}  // namespace towers::cli
