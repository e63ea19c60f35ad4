// Vector kernels over f32 arrays, dispatched at run time to the best Highway target of this CPU.
// Reductions use a fixed accumulation order for a given target, so a result never depends on the
// caller's thread count (docs/numerics.md).
#pragma once
#include <cstddef>

namespace towers::simd {

// sum_i a[i]*b[i]
float dot_f32(const float* a, const float* b, size_t n);
// y[i] += alpha * x[i]
void axpy_f32(float alpha, const float* x, float* y, size_t n);
// out[i] = silu(g[i]) * u[i] = g[i] / (1 + e^-g[i]) * u[i] (SwiGLU's gate; Highway's Exp). out may
// alias g or u.
void swiglu_f32(const float* g, const float* u, float* out, size_t n);
// Name of the target dot_f32 runs on (e.g. "AVX3", "AVX2", "NEON").
const char* target_name();

}  // namespace towers::simd
