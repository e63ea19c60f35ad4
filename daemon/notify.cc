#include "daemon/notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace towers::daemon {

bool sd_notify_message(const std::string& state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (!path || !*path) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t len = std::strlen(path);
  if (len >= sizeof(addr.sun_path)) return false;
  std::memcpy(addr.sun_path, path, len);
  if (path[0] == '@') addr.sun_path[0] = '\0';
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const socklen_t alen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len);
  ssize_t n = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr), alen);
  ::close(fd);
  return n == static_cast<ssize_t>(state.size());
}

std::chrono::microseconds watchdog_interval() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  if (!usec) return std::chrono::microseconds(0);
  if (const char* pid = std::getenv("WATCHDOG_PID"); pid && std::atol(pid) != static_cast<long>(::getpid())) {
    return std::chrono::microseconds(0);
  }
  return std::chrono::microseconds(std::strtoull(usec, nullptr, 10));
}

uint64_t process_cpu_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

StartupNotifier::StartupNotifier(std::chrono::milliseconds every, std::function<uint64_t()> progress)
    : every_(every), progress_(std::move(progress)), last_(progress_()) {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  if (!socket || !*socket) return;
  thread_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, every_, [this] { return stopping_; })) tick();
  });
}

StartupNotifier::~StartupNotifier() { stop(); }

bool StartupNotifier::tick() {
  const uint64_t now = progress_();
  if (now == last_) return false;
  last_ = now;
  const auto extend = std::chrono::duration_cast<std::chrono::microseconds>(every_ * 3);
  return sd_notify_message("EXTEND_TIMEOUT_USEC=" + std::to_string(extend.count()));
}

void StartupNotifier::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StartupNotifier::ready(const std::string& status) {
  stop();
  sd_notify_message("READY=1\nSTATUS=" + status);
}

}  // namespace towers::daemon
