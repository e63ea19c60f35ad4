// Listening, accepting and admitting: the I/O threads, the peer check at accept time, the
// connection limits and what happens at them, the open-file limit. A connection's own life is in
// daemon/http_connection.cc.
#include "daemon/http_server.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>
#include <unordered_map>

#include "daemon/http_connection.h"
#include "daemon/log.h"

namespace towers::daemon {

using namespace http_detail;
using boost::system::error_code;
using Acceptor = asio::basic_socket_acceptor<asio::generic::stream_protocol>;

namespace {

// File descriptors kept for everything but connections (an idle towerd holds about 12: state log
// and lock, io_uring, epoll, eventfd, timerfd, listening sockets; warm-tier files come and go).
constexpr long kFdReserve = 24;
// Connections being refused (per kind: peer refused, over a limit) or lingering after their last
// answer, at once; beyond it a refused connection is closed without an answer and a finished one
// closed without lingering.
constexpr int kLaneCap = 8;
constexpr auto kFdBackoff = std::chrono::milliseconds(100);  // accept paused when out of descriptors
constexpr auto kFdLogEvery = std::chrono::seconds(10);
constexpr int64_t kTcpKey = -1;                               // every TCP peer counts as one "uid"
// An idle connection may be closed for a newcomer once it has been idle this long: a client that
// just connected has its request on the way, and one that was just answered may be sending the next.
constexpr auto kReclaimAfter = std::chrono::milliseconds(500);

bool out_of_descriptors(const error_code& ec) {
  return ec == asio::error::no_descriptors || ec.value() == ENFILE || ec == asio::error::no_buffer_space ||
         ec == asio::error::no_memory;
}

// What a registered connection occupies: a connection slot (counted in the total and its key's
// share), or one of the small lanes beside them.
enum class Slot { Admitted, RefusingPeer, RefusingLimit, Lingering };
constexpr int kLanes = 4;

}  // namespace

struct HttpServer::Impl {
  std::shared_ptr<Edge> edge = std::make_shared<Edge>();
  const HttpServerOptions& opt = edge->options;
  asio::io_context ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  PeerPolicy peers;

  struct Listener {
    std::unique_ptr<Acceptor> acceptor;
    bool tcp;
    asio::steady_timer backoff;
    Clock::time_point fd_logged{};  // out of descriptors: logged at most every kFdLogEvery
    uint64_t fd_failures = 0;       // since that log line
  };
  std::vector<std::unique_ptr<Listener>> listeners;

  struct Entry {
    std::shared_ptr<Connection> conn;
    Slot slot;
  };
  mutable std::mutex mu;
  std::condition_variable idle;
  std::unordered_map<Connection*, Entry> conns;  // every connection not closed yet
  std::map<int64_t, int> per_key;                // admitted connections by key
  int count[kLanes] = {0, 0, 0, 0};              // by Slot
  int limit = 0, per_limit = 0;
  std::set<uint32_t> refused_uids_logged;
  std::atomic<bool> stopped{false};
  std::atomic<uint64_t> accepted{0}, refused_peer{0}, refused_limit{0}, reclaimed{0}, fd_exhausted{0};

  explicit Impl(HttpServerOptions o) : peers(o.allowed_uids, o.allowed_gids, o.socket_gid) {
    edge->options = std::move(o);
    edge->closed = [this](Connection* c) {
      std::lock_guard lock(mu);
      forget_locked(c);
    };
    edge->lingering = [this](Connection* c) {
      std::lock_guard lock(mu);
      auto it = conns.find(c);
      if (it == conns.end() || count[static_cast<int>(Slot::Lingering)] >= kLaneCap) return false;
      move_locked(it->second, Slot::Lingering);  // answered: its slot serves someone else now
      return true;
    };
  }

  static int64_t key_of(const Connection& c) { return c.tcp() ? kTcpKey : c.uid(); }

  void set_limits() {
    limit = std::max(1, opt.max_connections);
    const long lanes = 3 * kLaneCap;  // refusals of both kinds and lingering ones
    rlimit r{};
    if (::getrlimit(RLIMIT_NOFILE, &r) == 0) {
      const rlim_t want = static_cast<rlim_t>(limit + kFdReserve + lanes);
      if (r.rlim_cur < want && r.rlim_cur < r.rlim_max) {
        r.rlim_cur = std::min(want, r.rlim_max);
        ::setrlimit(RLIMIT_NOFILE, &r);
        ::getrlimit(RLIMIT_NOFILE, &r);
      }
      const long room = static_cast<long>(r.rlim_cur) - kFdReserve - lanes;
      if (room < limit) {
        limit = static_cast<int>(std::max(4L, room));
        log_warn("server.max_connections " + std::to_string(opt.max_connections) + " lowered to " +
                 std::to_string(limit) + ": the open-file limit is " + std::to_string(r.rlim_cur) + " (ulimit -n)");
      }
    }
    // One uid never gets every slot: what is left serves the others.
    per_limit = std::max(1, std::min(opt.max_connections_per_uid, limit - std::max(1, limit / 4)));
  }

  void accept(Listener& l) {
    if (stopped) return;
    l.acceptor->async_accept(asio::make_strand(ioc), [this, &l](error_code ec, auto socket) {
      on_accept(l, ec, Socket(std::move(socket)));
    });
  }

  void on_accept(Listener& l, error_code ec, Socket socket) {
    if (stopped || ec == asio::error::operation_aborted) return;
    if (ec) {
      if (!out_of_descriptors(ec)) {
        log_warn("accept: " + ec.message());
        return accept(l);
      }
      // Retrying at once would spin: the socket stays readable. Make room or wait.
      fd_exhausted++;
      l.fd_failures++;
      const bool freed = reclaim_any();
      if (Clock::now() - l.fd_logged >= kFdLogEvery) {
        l.fd_logged = Clock::now();
        log_warn("out of file descriptors (" + ec.message() + "): " + std::to_string(l.fd_failures) +
                 " accepts failed, " + std::to_string(open_count()) + " connections open; " +
                 (freed ? "closing an idle connection or a refusal" : "accepting paused") +
                 " (raise ulimit -n or lower server.max_connections)");
        l.fd_failures = 0;
      }
      // A freed descriptor is back once the victim's strand closed it: a short pause, not a spin.
      l.backoff.expires_after(freed ? std::chrono::milliseconds(2) : kFdBackoff);
      l.backoff.async_wait([this, &l](error_code e) {
        if (!e) accept(l);
      });
      return;
    }
    accepted++;
    admit(l.tcp, std::move(socket));
    accept(l);
  }

  void admit(bool tcp, Socket socket) {
    int uid = -1, gid = -1;
    if (!tcp) {
      ucred cred{};
      socklen_t len = sizeof cred;
      if (::getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
        uid = static_cast<int>(cred.uid);
        gid = static_cast<int>(cred.gid);
      }
    }
    auto conn = std::make_shared<Connection>(std::move(socket), edge, tcp, uid, gid);
    if (!tcp && (uid < 0 || !peers.allowed(static_cast<uint32_t>(uid), static_cast<uint32_t>(gid)))) {
      refused_peer++;
      log_refused_peer(uid, gid);
      return start_refusal(conn, Slot::RefusingPeer,
                           Status::PermissionDenied("uid " + std::to_string(uid) +
                                                    " may not use this daemon (server.allowed_uids, allowed_gids, "
                                                    "socket_group)"));
    }
    const int64_t key = key_of(*conn);
    std::shared_ptr<Connection> victim;
    bool admitted = false;
    {
      std::lock_guard lock(mu);
      const bool key_full = per_key[key] >= per_limit;
      const bool total_full = count[static_cast<int>(Slot::Admitted)] >= limit;
      if (key_full || total_full) {
        victim = oldest_locked(Slot::Admitted, key_full ? std::optional<int64_t>(key) : std::nullopt);
        if (victim) forget_locked(victim.get());
      }
      if ((!key_full && !total_full) || victim) {
        conns[conn.get()] = {conn, Slot::Admitted};
        per_key[key]++;
        count[static_cast<int>(Slot::Admitted)]++;
        admitted = true;
      }
    }
    if (victim) {
      reclaimed++;
      victim->close_async();
    }
    if (admitted) return asio::post(conn->executor(), [conn] { conn->start(); });
    refused_limit++;
    start_refusal(conn, Slot::RefusingLimit,
                  Status::Unavailable("too many connections (server.max_connections " + std::to_string(limit) +
                                      ", max_connections_per_uid " + std::to_string(per_limit) + "); retry shortly"));
  }

  // A refused connection gets its request header read and answered, unless too many are already.
  void start_refusal(const std::shared_ptr<Connection>& conn, Slot slot, ApiStatus why) {
    {
      std::lock_guard lock(mu);
      if (count[static_cast<int>(slot)] >= kLaneCap) return;  // dropped: the socket closes with conn
      count[static_cast<int>(slot)]++;
      conns[conn.get()] = {conn, slot};
    }
    asio::post(conn->executor(), [conn, why = std::move(why)]() mutable { conn->start_refusal(std::move(why)); });
  }

  // Admitted: the connection idle longest (nothing of a request received, for kReclaimAfter), of
  // one key or of any. Another slot: the oldest in it.
  std::shared_ptr<Connection> oldest_locked(Slot slot, std::optional<int64_t> key = std::nullopt) const {
    std::shared_ptr<Connection> best;
    const auto before = Clock::now() - kReclaimAfter;
    for (const auto& [p, e] : conns) {
      const Connection& c = *e.conn;
      if (e.slot != slot || (key && key_of(c) != *key)) continue;
      if (slot == Slot::Admitted && (c.phase() != Phase::Await || c.phase_since() > before)) continue;
      if (!best || c.phase_since() < best->phase_since()) best = e.conn;
    }
    return best;
  }

  // Out of descriptors: an idle connection goes, else a lingering one, else a refusal (its client
  // sees a reset instead of a 403/503), so that accepting can go on.
  bool reclaim_any() {
    std::shared_ptr<Connection> victim;
    {
      std::lock_guard lock(mu);
      for (Slot s : {Slot::Admitted, Slot::Lingering, Slot::RefusingLimit, Slot::RefusingPeer}) {
        if ((victim = oldest_locked(s))) break;
      }
      if (victim) forget_locked(victim.get());
    }
    if (!victim) return false;
    reclaimed++;
    victim->close_async();
    return true;
  }

  void leave_slot_locked(const Entry& e) {
    if (e.slot == Slot::Admitted) {
      const int64_t key = key_of(*e.conn);
      if (--per_key[key] == 0) per_key.erase(key);
    }
    count[static_cast<int>(e.slot)]--;
    idle.notify_all();
  }

  void move_locked(Entry& e, Slot to) {
    leave_slot_locked(e);
    count[static_cast<int>(to)]++;
    e.slot = to;
  }

  void forget_locked(Connection* c) {
    auto it = conns.find(c);
    if (it == conns.end()) return;
    leave_slot_locked(it->second);
    conns.erase(it);
  }

  void log_refused_peer(int uid, int gid) {
    bool first;
    {
      std::lock_guard lock(mu);
      first = refused_uids_logged.size() < 1024 && refused_uids_logged.insert(static_cast<uint32_t>(uid)).second;
    }
    const std::string line = "refused a connection from uid " + std::to_string(uid) + " gid " + std::to_string(gid) +
                             " (not root, the daemon's uid, allowed_uids, or a member of socket_group/allowed_gids)";
    if (first) log_warn(line);
    else log_debug(line);
  }

  int open_count() const {
    std::lock_guard lock(mu);
    return count[static_cast<int>(Slot::Admitted)];
  }
};

HttpServer::HttpServer(HttpServerOptions options, Handler handler) : impl_(std::make_unique<Impl>(std::move(options))) {
  impl_->edge->handler = std::move(handler);
}

HttpServer::~HttpServer() {
  stop_accepting();
  {
    std::lock_guard lock(impl_->mu);
    for (auto& [p, e] : impl_->conns) e.conn->close_async();
  }
  impl_->work.reset();
  wait_idle(std::chrono::milliseconds(1000));
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->edge->closed = nullptr;
  impl_->edge->lingering = nullptr;
}

Status HttpServer::start() {
  auto& o = impl_->opt;
  namespace fs = std::filesystem;
  impl_->set_limits();
  try {
    fs::path sp(o.socket_path);
    std::error_code fec;
    if (!sp.parent_path().empty()) fs::create_directories(sp.parent_path(), fec);
    if (fs::exists(sp, fec)) {
      if (!fs::is_socket(sp, fec)) return Status::Error(o.socket_path + " exists and is not a socket");
      // A live daemon answers; a stale file from a crash does not.
      asio::local::stream_protocol::socket probe(impl_->ioc);
      error_code ec;
      probe.connect(asio::local::stream_protocol::endpoint(o.socket_path), ec);
      if (!ec) return Status::Error("another daemon is listening on " + o.socket_path);
      fs::remove(sp, fec);
    }
    auto add = [&](asio::generic::stream_protocol::endpoint ep, bool tcp) {
      auto l = std::make_unique<Impl::Listener>(Impl::Listener{
          std::make_unique<Acceptor>(impl_->ioc), tcp, asio::steady_timer(impl_->ioc)});
      l->acceptor->open(ep.protocol());
      if (tcp) l->acceptor->set_option(asio::socket_base::reuse_address(true));
      l->acceptor->bind(ep);
      l->acceptor->listen(asio::socket_base::max_listen_connections);
      impl_->listeners.push_back(std::move(l));
    };
    add(asio::local::stream_protocol::endpoint(o.socket_path), false);
    if (::chmod(o.socket_path.c_str(), o.socket_mode) != 0) {
      return Status::Error("cannot chmod " + o.socket_path + ": " + std::strerror(errno));
    }
    if (o.socket_gid >= 0 && ::chown(o.socket_path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(o.socket_gid)) != 0) {
      return Status::Error("cannot give " + o.socket_path + " to group " + std::to_string(o.socket_gid) + ": " +
                           std::strerror(errno));
    }
    if (!o.tcp_host.empty()) {
      add(asio::ip::tcp::endpoint(asio::ip::make_address(o.tcp_host), o.tcp_port), true);
    }
  } catch (const std::exception& e) {
    return Status::Error("cannot listen: " + std::string(e.what()));
  }
  impl_->work.emplace(impl_->ioc.get_executor());
  for (int i = 0; i < std::max(1, o.io_threads); ++i) {
    impl_->threads.emplace_back([this] { impl_->ioc.run(); });
  }
  for (auto& l : impl_->listeners) {
    asio::post(impl_->ioc, [impl = impl_.get(), l = l.get()] { impl->accept(*l); });
  }
  return Status::Ok();
}

void HttpServer::stop_accepting() {
  if (impl_->stopped.exchange(true)) return;
  impl_->edge->stopping = true;
  for (auto& l : impl_->listeners) {
    asio::post(impl_->ioc, [l = l.get()] {
      error_code ec;
      l->backoff.cancel();
      l->acceptor->close(ec);
    });
  }
  std::error_code fec;
  if (!impl_->listeners.empty()) std::filesystem::remove(impl_->opt.socket_path, fec);
  std::lock_guard lock(impl_->mu);
  for (auto& [p, e] : impl_->conns) e.conn->stop_async();
}

int HttpServer::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->mu);
  const int& open = impl_->count[static_cast<int>(Slot::Admitted)];
  impl_->idle.wait_for(lock, timeout, [&] { return open == 0; });
  return open;
}

HttpServerStats HttpServer::stats() const {
  const Impl& i = *impl_;
  HttpServerStats s;
  s.open = i.open_count();
  s.limit = i.limit;
  s.accepted = i.accepted;
  s.refused_peer = i.refused_peer;
  s.refused_limit = i.refused_limit;
  s.reclaimed = i.reclaimed;
  s.fd_exhausted = i.fd_exhausted;
  s.header_timeouts = i.edge->header_timeouts;
  s.body_timeouts = i.edge->body_timeouts;
  s.idle_timeouts = i.edge->idle_timeouts;
  s.dropped_slow_readers = i.edge->dropped_slow_readers;
  s.client_disconnects = i.edge->client_disconnects;
  return s;
}

}  // namespace towers::daemon
