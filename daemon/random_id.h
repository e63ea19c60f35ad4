// Random identifiers for things the daemon names itself ("chatcmpl-…" completions, "s-…" sessions).
#pragma once
#include <cstdio>
#include <mutex>
#include <random>
#include <string>

namespace towers::daemon {

// prefix followed by 16 random hex digits; safe from any thread.
inline std::string random_hex_id(const std::string& prefix) {
  static std::mt19937_64 rng{std::random_device{}()};
  static std::mutex mu;
  std::lock_guard lock(mu);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return prefix + buf;
}

}  // namespace towers::daemon
