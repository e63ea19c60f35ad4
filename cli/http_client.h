// A small HTTP/1.1 client for towerd's Unix socket (Boost.Beast). One request per connection; the
// connect, the write and every read wait at most `timeout_s` (0 = no limit). A streamed reply
// (Server-Sent Events) is handed over one `data:` payload at a time until `data: [DONE]`.
// Failures to reach or talk to the daemon throw ClientError with a message ready to print.
// interrupt_on_sigint(): Ctrl-C during a request closes its connection (towerd cancels the work) and
// the reply comes back marked interrupted, instead of ending the program.
#pragma once
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace towers::cli {

struct ClientError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct HttpReply {
  int status = 0;
  std::string content_type;
  std::string body;         // the whole body (not for an event stream)
  std::string retry_after;  // the Retry-After header, if any
  bool stream_done = false; // an event stream ended with data: [DONE]
  bool interrupted = false; // SIGINT arrived (interrupt_on_sigint) and the connection was closed
};

class HttpClient {
 public:
  HttpClient(std::string socket_path, double timeout_s) : socket_(std::move(socket_path)), timeout_s_(timeout_s) {}

  // method, target ("/v1/pool"), body (JSON; "" = none).
  HttpReply request(const std::string& method, const std::string& target, const std::string& body = "") {
    return stream(method, target, body, nullptr);
  }
  // As request(); when the reply is text/event-stream, on_data gets each event's data (not [DONE])
  // as it arrives, and the body stays empty.
  HttpReply stream(const std::string& method, const std::string& target, const std::string& body,
                   const std::function<void(std::string_view)>& on_data);

  const std::string& socket_path() const { return socket_; }
  // While a request runs SIGINT interrupts it; between requests SIGINT has its default effect.
  void interrupt_on_sigint(bool on) { sigint_ = on; }

 private:
  std::string socket_;
  double timeout_s_;
  bool sigint_ = false;
};

// Splits an event stream into events: feed() bytes as they come; each complete event's data lines
// (joined by "\n") go to on_data, except "[DONE]", which sets done().
class SseParser {
 public:
  explicit SseParser(std::function<void(std::string_view)> on_data) : on_data_(std::move(on_data)) {}
  void feed(std::string_view bytes);
  void finish();  // dispatches a last event not followed by a blank line
  bool done() const { return done_; }

 private:
  void line(std::string_view l);
  std::function<void(std::string_view)> on_data_;
  std::string partial_, data_;
  bool has_data_ = false, done_ = false;
};

}  // namespace towers::cli
