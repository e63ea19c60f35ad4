// systemd's notify protocol without libsystemd: datagrams ("READY=1", "STOPPING=1", "WATCHDOG=1",
// "STATUS=...", "EXTEND_TIMEOUT_USEC=...") to the socket named by $NOTIFY_SOCKET (a path, or "@name"
// for the abstract namespace). Does nothing when the variable is unset (not run by systemd, or
// Type=simple).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace towers::daemon {

bool sd_notify_message(const std::string& state);
// The watchdog period systemd asked for ($WATCHDOG_USEC, for this pid), or zero.
std::chrono::microseconds watchdog_interval();
// CPU time this process has used so far (all threads), in nanoseconds.
uint64_t process_cpu_ns();

// Covers a start that takes longer than the unit's TimeoutStartSec (a large model to load and
// fingerprint, many segments to prefill again): every `every`, if `progress` grew since the last
// look, sends EXTEND_TIMEOUT_USEC of three periods. Progress is the process's CPU time, so a start
// that hangs (no CPU used) is not extended and systemd's own timeout still ends it. ready() stops the
// reports and sends READY=1. Without $NOTIFY_SOCKET no thread is started. Create it after blocking
// signals: its thread inherits the mask.
class StartupNotifier {
 public:
  explicit StartupNotifier(std::chrono::milliseconds every = std::chrono::seconds(10),
                           std::function<uint64_t()> progress = process_cpu_ns);
  ~StartupNotifier();
  StartupNotifier(const StartupNotifier&) = delete;
  StartupNotifier& operator=(const StartupNotifier&) = delete;

  // One look at `progress`; true if it grew and the extension was sent. (The thread's step; public
  // for tests.)
  bool tick();
  // Stops the reports, then "READY=1\nSTATUS=<status>".
  void ready(const std::string& status);

 private:
  void stop();

  const std::chrono::milliseconds every_;
  const std::function<uint64_t()> progress_;
  uint64_t last_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace towers::daemon
