// Clocks for the benchmarks (bench/ only). These run on shared 2-core VMs, so the kernel benches
// report the least disturbed round rather than a mean.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstddef>

namespace towers::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best seconds per call of fn() over `rounds` rounds of at least secs/rounds each (one warm-up call).
template <class Fn>
double best_seconds_per_call(double secs, int rounds, Fn&& fn) {
  fn();
  double best = 1e30;
  for (int round = 0; round < rounds; ++round) {
    size_t calls = 0;
    const double t0 = now_s();
    double t1 = t0;
    while (t1 - t0 < secs / rounds || calls == 0) {
      fn();
      ++calls;
      t1 = now_s();
    }
    best = std::min(best, (t1 - t0) / static_cast<double>(calls));
  }
  return best;
}

}  // namespace towers::bench
