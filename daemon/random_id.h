// Random identifiers for things the daemon names itself ("chatcmpl-…" completions, "s-…" sessions),
// and the seeds of requests that name none.
#pragma once
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>

namespace towers::daemon {

// 64 random bits, from one generator seeded once from the system; safe from any thread.
inline uint64_t random_u64() {
  static std::mt19937_64 rng{std::random_device{}()};
  static std::mutex mu;
  std::lock_guard lock(mu);
  return rng();
}

// prefix followed by 16 random hex digits.
inline std::string random_hex_id(const std::string& prefix) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(random_u64()));
  return prefix + buf;
}

// A sampling seed for a request that gave none: below 2^53, so that it survives a JavaScript client's
// numbers when the reply's "towers.seed" is sent back to replay the reply.
inline uint64_t random_seed() { return random_u64() & ((uint64_t(1) << 53) - 1); }

}  // namespace towers::daemon
