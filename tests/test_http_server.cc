// towerd's HTTP server in-process, without a model: the handler contract (answers from another
// thread, streams, on_close on a disconnect and never after a complete answer, a dropped responder,
// a throwing handler), keep-alive with a request sent early, a client that stops reading, bodies
// over the limit, Expect: 100-continue, and stopping. Clients are plain blocking Unix sockets.
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <filesystem>
#include <future>
#include <thread>

#include "daemon/http_server.h"

using namespace towers::daemon;
using namespace std::chrono_literals;

namespace {

std::string temp_socket() {
  static std::atomic<int> n{0};
  return (std::filesystem::temp_directory_path() /
          ("towers-http-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".sock"))
      .string();
}

class Client {
 public:
  explicit Client(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    timeval tv{10, 0};  // a broken server fails the test instead of hanging it
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~Client() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void send(const std::string& s) { REQUIRE(::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size())); }
  // Reads until `until` appears in what was read (or EOF/timeout); returns everything read.
  std::string read_until(const std::string& until) {
    while (buf_.find(until) == std::string::npos) {
      char b[65536];
      const ssize_t n = ::recv(fd_, b, sizeof b, 0);
      if (n <= 0) break;
      buf_.append(b, static_cast<size_t>(n));
    }
    return buf_;
  }
  std::string read_all() { return read_until(std::string(1, '\0') + "never"); }
  void forget() { buf_.clear(); }

 private:
  int fd_ = -1;
  std::string buf_;
};

const std::string kGet = "GET /x HTTP/1.1\r\nHost: localhost\r\n\r\n";

struct Fixture {
  std::string path = temp_socket();
  std::unique_ptr<HttpServer> server;
  void serve(HttpServer::Handler h, size_t max_body = 1 << 20) {
    HttpServerOptions o;
    o.socket_path = path;
    o.max_body_bytes = max_body;
    server = std::make_unique<HttpServer>(o, std::move(h));
    REQUIRE(server->start().ok());
  }
};

}  // namespace

TEST_CASE("a handler answers later from another thread, and streams from it") {
  Fixture f;
  std::vector<std::thread> threads;
  f.serve([&](const HttpRequest& req, std::shared_ptr<HttpResponder> out) {
    threads.emplace_back([req, out] {
      if (req.path == "/whole") return out->send(200, "text/plain", "whole answer");
      REQUIRE(out->start_stream(200, "text/event-stream"));
      for (int i = 0; i < 100; ++i) CHECK(out->write_chunk("data: " + std::to_string(i) + "\n\n"));
      out->end_stream();
    });
  });
  Client c(f.path);
  c.send("GET /whole HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(c.read_until("whole answer").find("HTTP/1.1 200 OK") == 0);
  c.forget();
  c.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");  // the same connection (keep-alive)
  const std::string s = c.read_until("0\r\n\r\n");
  CHECK(s.find("Transfer-Encoding: chunked") != std::string::npos);
  CHECK(s.find("data: 0\n\n") != std::string::npos);
  CHECK(s.find("data: 99\n\n") != std::string::npos);
  CHECK(s.rfind("0\r\n\r\n") == s.size() - 5);
  for (auto& t : threads) t.join();
}

TEST_CASE("on_close fires when the client disconnects mid-response, not after a complete answer") {
  Fixture f;
  std::promise<void> closed;
  std::atomic<int> closes_after_answer{0};
  std::shared_ptr<HttpResponder> held;
  f.serve([&](const HttpRequest& req, std::shared_ptr<HttpResponder> out) {
    if (req.path == "/answered") {
      out->on_close([&] { closes_after_answer++; });
      return out->send(200, "text/plain", "ok");
    }
    out->on_close([&] { closed.set_value(); });
    out->start_stream(200, "text/event-stream");
    held = out;  // kept, as a generation keeps it
  });
  {
    Client c(f.path);
    c.send("GET /answered HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    CHECK(c.read_all().find("HTTP/1.1 200 OK") == 0);
  }
  Client c(f.path);
  c.send(kGet);
  c.read_until("\r\n\r\n");
  c.close();
  REQUIRE(closed.get_future().wait_for(5s) == std::future_status::ready);
  CHECK(held->client_gone());
  CHECK(!held->write_chunk("more"));
  bool late = false;
  held->on_close([&] { late = true; });  // already closed: runs at once
  CHECK(late);
  held.reset();
  CHECK(f.server->wait_idle(5s) == 0);
  CHECK(closes_after_answer == 0);
}

TEST_CASE("client_gone sees a peer that hung up before any I/O thread read its end") {
  // The one I/O thread is held inside the handler: only a look at the socket itself can tell that
  // the client left (the scheduler asks before every step, so a busy I/O thread cannot delay it).
  Fixture f;
  std::promise<std::shared_ptr<HttpResponder>> got;
  std::promise<void> release;
  auto released = release.get_future().share();
  HttpServerOptions o;
  o.socket_path = f.path;
  o.io_threads = 1;
  f.server = std::make_unique<HttpServer>(o, [&](const HttpRequest&, std::shared_ptr<HttpResponder> out) {
    out->start_stream(200, "text/event-stream");
    got.set_value(out);
    released.wait();
  });
  REQUIRE(f.server->start().ok());
  auto c = std::make_unique<Client>(f.path);
  c->send(kGet);
  auto out = got.get_future().get();
  CHECK(!out->client_gone());
  c->close();
  CHECK(out->client_gone());
  release.set_value();
  out.reset();
  CHECK(f.server->wait_idle(5s) == 0);
}

TEST_CASE("a dropped responder answers 500 and so does a throwing handler") {
  Fixture f;
  f.serve([](const HttpRequest& req, std::shared_ptr<HttpResponder>) {
    if (req.path == "/throw") throw std::runtime_error("boom");
  });
  Client c(f.path);
  c.send(kGet);
  CHECK(c.read_until("}\n").find("HTTP/1.1 500") == 0);
  Client d(f.path);
  d.send("GET /throw HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string r = d.read_until("}\n");
  CHECK(r.find("HTTP/1.1 500") == 0);
  CHECK(r.find("boom") != std::string::npos);
}

TEST_CASE("a request sent before the previous answer waits for it") {
  Fixture f;
  std::promise<std::shared_ptr<HttpResponder>> first;
  std::atomic<int> calls{0};
  f.serve([&](const HttpRequest& req, std::shared_ptr<HttpResponder> out) {
    if (calls++ == 0) return first.set_value(out);  // answered below, after the second request is sent
    out->send(200, "text/plain", "second:" + req.path);
  });
  Client c(f.path);
  c.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n");
  auto out = first.get_future().get();
  CHECK(calls == 1);
  out->send(200, "text/plain", "first");
  const std::string r = c.read_until("second:/b");
  CHECK(r.find("first") < r.find("second:/b"));
}

TEST_CASE("a next request whose bytes arrive while the previous one is answered is read whole") {
  // The next request's header and the start of its body arrive while the previous answer is being
  // produced, the rest after it: the bytes read meanwhile and the bytes read after the buffer was
  // parsed empty must join in order (a read into a region prepared before the buffer was emptied
  // lost them: 405s and body timeouts under keep-alive).
  Fixture f;
  std::mutex mu;
  std::condition_variable cv;
  std::shared_ptr<HttpResponder> held;
  f.serve([&](const HttpRequest& req, std::shared_ptr<HttpResponder> out) {
    if (req.path == "/hold") {
      std::lock_guard lock(mu);
      held = out;
      cv.notify_all();
      return;
    }
    out->send(200, "text/plain", "echo:" + req.body + ":end");
  });
  Client c(f.path);
  for (int i = 0; i < 200; ++i) {
    CAPTURE(i);
    c.send("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    std::shared_ptr<HttpResponder> out;
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return held != nullptr; });
      out = std::exchange(held, nullptr);
    }
    const std::string body = "body-" + std::to_string(i) + std::string(static_cast<size_t>(i % 37), 'x');
    const std::string next = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    const size_t cut = next.size() - 1 - static_cast<size_t>(i % 5);
    c.send(next.substr(0, cut));
    out->send(200, "text/plain", "held");
    c.read_until("held");
    c.send(next.substr(cut));
    const std::string r = c.read_until(":end");
    CHECK(r.find("echo:" + body + ":end") != std::string::npos);
    c.forget();
  }
}

TEST_CASE("a client that stops reading its stream is dropped, and on_close fires") {
  Fixture f;
  std::promise<void> closed;
  std::promise<int> chunks;
  f.serve([&](const HttpRequest&, std::shared_ptr<HttpResponder> out) {
    out->on_close([&] { closed.set_value(); });
    std::thread([out, &chunks] {
      out->start_stream(200, "text/event-stream");
      const std::string chunk(64 * 1024, 'x');
      int n = 0;
      while (n < 10000 && out->write_chunk(chunk)) n++;  // 640 MB if it were never refused
      chunks.set_value(n);
    }).detach();
  });
  Client c(f.path);
  c.send(kGet);  // and never reads
  auto n = chunks.get_future();
  REQUIRE(n.wait_for(10s) == std::future_status::ready);
  CHECK(n.get() < 10000);
  CHECK(closed.get_future().wait_for(5s) == std::future_status::ready);
}

TEST_CASE("bodies: over the limit refused before reading, 100-continue answered, within the limit served") {
  Fixture f;
  f.serve([](const HttpRequest& req, std::shared_ptr<HttpResponder> out) {
    out->send(200, "text/plain", "got " + std::to_string(req.body.size()));
  }, 1000);
  Client big(f.path);
  big.send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n");
  const std::string r = big.read_all();
  CHECK(r.find("HTTP/1.1 413") == 0);
  CHECK(r.find("100 Continue") == std::string::npos);
  Client ok(f.path);
  ok.send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n");
  CHECK(ok.read_until("\r\n\r\n").find("HTTP/1.1 100 Continue") == 0);
  ok.send("0123456789");
  CHECK(ok.read_until("got 10").find("got 10") != std::string::npos);
}

TEST_CASE("stopping closes idle connections and answered requests were counted") {
  Fixture f;
  std::atomic<int> answered{0};
  HttpServerOptions o;
  o.socket_path = f.path;
  o.on_response = [&](std::string_view method, std::string_view path, int status, double) {
    if (method == "GET" && path == "/x" && status == 204) answered++;
  };
  HttpServer server(o, [](const HttpRequest&, std::shared_ptr<HttpResponder> out) { out->send(204, "", ""); });
  REQUIRE(server.start().ok());
  Client c(f.path);
  c.send(kGet);
  CHECK(c.read_until("\r\n\r\n").find("HTTP/1.1 204") == 0);
  CHECK(answered == 1);
  CHECK(server.stats().open == 1);  // idle, kept alive
  server.stop_accepting();
  CHECK(server.wait_idle(5s) == 0);
  CHECK(!std::filesystem::exists(f.path));
}

TEST_CASE("HTTP/1.0 streams without chunks end with the close and HEAD answers have no body") {
  Fixture f;
  f.serve([](const HttpRequest&, std::shared_ptr<HttpResponder> out) {
    out->start_stream(200, "text/event-stream");
    out->write_chunk("data: a\n\n");
    out->write_chunk("data: b\n\n");
    out->end_stream();
  });
  Client c(f.path);
  c.send("GET /x HTTP/1.0\r\n\r\n");
  const std::string r = c.read_all();  // ends: the server closes
  CHECK(r.find("Transfer-Encoding") == std::string::npos);
  CHECK(r.find("Connection: close") != std::string::npos);
  CHECK(r.substr(r.find("\r\n\r\n") + 4) == "data: a\n\ndata: b\n\n");

  Fixture g;
  g.serve([](const HttpRequest&, std::shared_ptr<HttpResponder> out) { out->send(200, "text/plain", "body"); });
  Client h(g.path);
  h.send("HEAD /x HTTP/1.1\r\nHost: x\r\n\r\nGET /x HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string two = h.read_until("\r\n\r\nbody");
  CHECK(two.find("Content-Length: 4\r\n") != std::string::npos);
  CHECK(two.find("\r\n\r\nHTTP/1.1 200") != std::string::npos);  // the HEAD answer had no body
}
