#include "daemon/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>

namespace towers::daemon {

namespace {
std::atomic<bool> g_debug{false};
bool journal() {
  static const bool j = std::getenv("JOURNAL_STREAM") != nullptr;
  return j;
}
}  // namespace

void set_log_debug(bool on) { g_debug = on; }

void log_line(LogLevel level, const std::string& message) {
  if (level == LogLevel::Debug && !g_debug) return;
  std::string line;
  if (journal()) {
    line = "<" + std::to_string(static_cast<int>(level)) + ">";
  } else {
    const char* name = level == LogLevel::Error ? "error" : level == LogLevel::Warning ? "warning"
                       : level == LogLevel::Info ? "info" : "debug";
    line = std::string("towerd: ") + name + ": ";
  }
  for (char ch : message) line.push_back(ch == '\n' ? ' ' : ch);
  line.push_back('\n');
  ssize_t rc = ::write(2, line.data(), line.size());
  (void)rc;
}

}  // namespace towers::daemon
