// daemon/notify.h: what towerd tells systemd while it starts — EXTEND_TIMEOUT_USEC only while the
// start makes progress, then READY=1 — checked on a datagram socket standing in for systemd's.
#include "daemon/notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "test_support.h"

using namespace towers::daemon;

namespace {

// A bound datagram socket at $NOTIFY_SOCKET for the life of the object.
class FakeSystemd {
 public:
  FakeSystemd() {
    path_ = (towers::test::temp_dir() / ("notify-" + std::to_string(::getpid()) + ".sock")).string();
    std::filesystem::remove(path_);
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    REQUIRE(path_.size() < sizeof addr.sun_path);
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    timeval tv{10, 0};  // a bound on a broken test, not a synchronisation
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setenv("NOTIFY_SOCKET", path_.c_str(), 1);
  }
  ~FakeSystemd() {
    ::unsetenv("NOTIFY_SOCKET");
    ::close(fd_);
    std::filesystem::remove(path_);
  }
  // The next datagram ("" after 10 s without one).
  std::string receive() {
    char buf[512];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  }
  // A datagram already waiting, or "".
  std::string pending() {
    char buf[512];
    ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

TEST_CASE("StartupNotifier extends the start timeout only while the start makes progress") {
  FakeSystemd systemd;
  uint64_t work = 0;
  // A period of an hour: the thread never ticks by itself here; the test ticks.
  StartupNotifier notifier(std::chrono::hours(1), [&work] { return work; });
  CHECK_FALSE(notifier.tick());  // no progress since it started: nothing sent
  CHECK(systemd.pending().empty());
  work = 5;
  CHECK(notifier.tick());
  CHECK(systemd.receive() == "EXTEND_TIMEOUT_USEC=10800000000");  // three periods, in microseconds
  CHECK_FALSE(notifier.tick());  // stuck again: nothing more
  CHECK(systemd.pending().empty());
  notifier.ready("serving m");  // also stops the hour-long wait at once
  CHECK(systemd.receive() == "READY=1\nSTATUS=serving m");
  CHECK(systemd.pending().empty());
}

TEST_CASE("StartupNotifier's thread reports a start that keeps working") {
  FakeSystemd systemd;
  std::atomic<uint64_t> work{0};
  StartupNotifier notifier(std::chrono::milliseconds(10), [&work] { return ++work; });
  CHECK(systemd.receive() == "EXTEND_TIMEOUT_USEC=30000");
  notifier.ready("serving m");
  // Reports sent before ready() may still be queued; READY=1 is the last message.
  std::string last;
  for (std::string m; !(m = systemd.pending()).empty();) last = m;
  CHECK(last == "READY=1\nSTATUS=serving m");
}

TEST_CASE("Without NOTIFY_SOCKET nothing is sent and no thread runs") {
  ::unsetenv("NOTIFY_SOCKET");
  uint64_t work = 0;
  StartupNotifier notifier(std::chrono::milliseconds(1), [&work] { return ++work; });
  CHECK_FALSE(notifier.tick());  // progress, but nowhere to send it
  CHECK_FALSE(sd_notify_message("READY=1"));
}

TEST_CASE("process_cpu_ns grows as the process works") {
  const uint64_t before = process_cpu_ns();
  volatile uint64_t x = 0;
  while (process_cpu_ns() == before) x = x + 1;
  CHECK(process_cpu_ns() > before);
}
