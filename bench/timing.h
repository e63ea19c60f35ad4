// Clocks for the benchmarks (bench/ only). These run on shared 2-core VMs, so the kernel benches
// report the least disturbed round rather than a mean.
//
// TOWERS_BENCH_CLOCK=cpu makes now_s the calling thread's CPU time instead of wall time, for the
// single-threaded kernel benches (bench_quant_dot, bench_kv_quant, bench_attention) when comparing
// two builds on a machine other jobs are using: a thread that waits for a core does not run up CPU
// time, so the comparison is not a lottery of the scheduler (cache and memory-bus contention still
// count). Wall time stays the default (it is what a user sees).
#pragma once
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <string_view>

namespace towers::bench {

inline bool cpu_clock() {
  static const bool cpu = [] {
    const char* e = std::getenv("TOWERS_BENCH_CLOCK");
    return e != nullptr && std::string_view(e) == "cpu";
  }();
  return cpu;
}

inline double now_s() {
  if (cpu_clock()) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
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
