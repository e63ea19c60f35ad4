#include "daemon/notify.h"

#include <sys/socket.h>
#include <sys/un.h>
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

}  // namespace towers::daemon
