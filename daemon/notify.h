// systemd's notify protocol without libsystemd: datagrams ("READY=1", "STOPPING=1", "WATCHDOG=1",
// "STATUS=...") to the socket named by $NOTIFY_SOCKET (a path, or "@name" for the abstract
// namespace). Does nothing when the variable is unset (not run by systemd, or Type=simple).
#pragma once
#include <chrono>
#include <string>

namespace towers::daemon {

bool sd_notify_message(const std::string& state);
// The watchdog period systemd asked for ($WATCHDOG_USEC, for this pid), or zero.
std::chrono::microseconds watchdog_interval();

}  // namespace towers::daemon
