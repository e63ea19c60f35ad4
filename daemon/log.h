// towerd's log: one line per event on stderr. Under systemd (JOURNAL_STREAM set) each line starts
// with a syslog priority prefix ("<6>" info, "<4>" warning, "<3>" error) that journald turns into the
// entry's priority; elsewhere lines read "towerd: info: ...". Lines are written whole (one write(2)),
// so threads never interleave within a line.
#pragma once
#include <string>

namespace towers::daemon {

enum class LogLevel { Error = 3, Warning = 4, Info = 6, Debug = 7 };

void log_line(LogLevel level, const std::string& message);
inline void log_info(const std::string& m) { log_line(LogLevel::Info, m); }
inline void log_warn(const std::string& m) { log_line(LogLevel::Warning, m); }
inline void log_error(const std::string& m) { log_line(LogLevel::Error, m); }
void set_log_debug(bool on);
inline void log_debug(const std::string& m) { log_line(LogLevel::Debug, m); }

}  // namespace towers::daemon
