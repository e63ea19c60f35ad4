#include "engine/base/membw.h"

#include <algorithm>
#include <chrono>

#include "engine/base/huge_buffer.h"

namespace towers {

double measure_memory_bandwidth(ThreadPool& pool, size_t bytes_per_array, int reps) {
  const size_t n = bytes_per_array / sizeof(float);
  // Huge pages, as the packed weights have (engine/base/huge_buffer.h): the roofline is what the memory
  // system can give, not what 4 KiB pages allow.
  HugeBuffer ba(n * sizeof(float)), bb(n * sizeof(float)), bc(n * sizeof(float));
  auto* a = reinterpret_cast<float*>(ba.data());
  auto* b = reinterpret_cast<float*>(bb.data());
  auto* c = reinterpret_cast<float*>(bc.data());
  pool.parallel_for(n, [&](size_t i0, size_t i1, int) {  // first touch by the threads that use them
    for (size_t i = i0; i < i1; ++i) a[i] = 0, b[i] = 1.0f, c[i] = 2.0f;
  });
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(n, [&](size_t i0, size_t i1, int) {
      float* __restrict pa = a;
      const float* __restrict pb = b;
      const float* __restrict pc = c;
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
