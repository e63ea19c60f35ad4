// Vector kernels over f32 arrays, dispatched at run time to the best Highway target of this CPU.
// Reductions use a fixed accumulation order for a given target, so a result never depends on the
// caller's thread count (docs/numerics.md).
#pragma once
#include <cstddef>
#include <cstdint>

namespace towers::simd {

// sum_i a[i]*b[i]
float dot_f32(const float* a, const float* b, size_t n);
// y[i] += alpha * x[i]
void axpy_f32(float alpha, const float* x, float* y, size_t n);
// out[i] = silu(g[i]) * u[i] = g[i] / (1 + e^-g[i]) * u[i] (SwiGLU's gate; Highway's Exp). out may
// alias g or u.
void swiglu_f32(const float* g, const float* u, float* out, size_t n);
// out[i] = gelu_tanh(g[i]) * u[i] = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u[i] (GeGLU's gate,
// the tanh approximation Gemma uses; evaluated as g / (1 + e^-2z), Highway's Exp). out may alias g or u.
void geglu_f32(const float* g, const float* u, float* out, size_t n);
// The same gate as ggml computes it (GGML_GELU_FP16, on by default in llama.cpp's CPU backend): g
// rounded to f16, gelu_tanh of it looked up in a table of f16 results (built once, with geglu_f32's
// formula), so out[i] = f16(gelu(f16(g))) * u[i]; 0 for g <= -10 and g itself for g >= 10. Scalar, one
// lookup per element; the table is built by the target dispatched at its first use.
void geglu_f32_ggml(const float* g, const float* u, float* out, size_t n);
// x[i] = cap * tanh(x[i] * scale / cap): logit soft-capping (Gemma 2), after scaling by `scale`.
void softcap_f32(float* x, size_t n, float scale, float cap);
// out[i] = x[i] * (1 / sqrt(sum_j x[j]^2 / n + eps)) * g[i] (RMSNorm; the sum is dot_f32's).
// out may alias x.
void rmsnorm_f32(const float* x, const float* g, float* out, size_t n, float eps);
// RoPE on one head: rotates pair i by the angle whose cosine and sine are cos[i], sin[i], i < half.
// Pairs are (v[i], v[half + i]) when neox, else (v[2i], v[2i + 1]). Same bits on every target as
// the plain formula a' = a cos - b sin, b' = a sin + b cos (no fused multiply-add).
void rope_f32(float* v, const float* cos, const float* sin, size_t half, bool neox);
// Symmetric quantization of v[0, n) to q (oneDNN's int8 prefill): scale = max|v| / qmax (returned),
// q[i] = v[i] * (qmax / max|v|) rounded half to even (lrintf's default mode), clamped to +-qmax
// (qmax <= 127). The scalar formula's bits on every target.
float quantize_symmetric_f32(const float* v, int8_t* q, size_t n, int qmax);
// out[i] = float(s[i]) * (a * w[i]): exact int32 sums scaled by a token's and a row's scale.
void scale_i32_f32(const int32_t* s, float a, const float* w, float* out, size_t n);
// Name of the target dot_f32 runs on (e.g. "AVX3", "AVX2", "NEON").
const char* target_name();

}  // namespace towers::simd
