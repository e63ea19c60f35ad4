// The machine's sustainable memory bandwidth, measured like STREAM's triad (a = b + s*c) on arrays far
// larger than the caches, with the same threads the forward pass uses.
#pragma once
#include "engine/base/thread_pool.h"

namespace towers {

// GB/s (1e9 bytes/s) counting the bytes of all three arrays per pass; the best of `reps` passes.
double measure_memory_bandwidth(ThreadPool& pool, size_t bytes_per_array = size_t(256) << 20, int reps = 5);

}  // namespace towers
