#include "engine/membw.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace towers {

double measure_memory_bandwidth(ThreadPool& pool, size_t bytes_per_array, int reps) {
  const size_t n = bytes_per_array / sizeof(float);
  std::vector<float> a(n), b(n), c(n);
  pool.parallel_for(n, [&](size_t i0, size_t i1, int) {  // first touch by the threads that use them
    for (size_t i = i0; i < i1; ++i) a[i] = 0, b[i] = 1.0f, c[i] = 2.0f;
  });
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(n, [&](size_t i0, size_t i1, int) {
      float* __restrict pa = a.data();
      const float* __restrict pb = b.data();
      const float* __restrict pc = c.data();
      for (size_t i = i0; i < i1; ++i) pa[i] = pb[i] + 3.0f * pc[i];
    });
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 3.0 * bytes_per_array / dt / 1e9);
  }
  volatile float sink = a[n / 2];  // keep the loop observable
  (void)sink;
  return best;
}

}  // namespace towers
