#include "simd/ops.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/ops.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace towers::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Four independent accumulators hide FMA latency; the combine order is fixed.
float DotF32(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(d, a + i + N), hn::LoadU(d, b + i + N), s1);
    s2 = hn::MulAdd(hn::LoadU(d, a + i + 2 * N), hn::LoadU(d, b + i + 2 * N), s2);
    s3 = hn::MulAdd(hn::LoadU(d, a + i + 3 * N), hn::LoadU(d, b + i + 3 * N), s3);
  }
  for (; i + N <= n; i += N) s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
  s0 = hn::Add(hn::Add(s0, s1), hn::Add(s2, s3));
  float sum = hn::GetLane(hn::SumOfLanes(d, s0));  // Highway 1.0.3 has no ReduceSum
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void AxpyF32(float alpha, const float* HWY_RESTRICT x, float* HWY_RESTRICT y, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto va = hn::Set(d, alpha);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::MulAdd(va, hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
  for (; i < n; ++i) y[i] += alpha * x[i];
}

// out = silu(g) * u = g / (1 + e^-g) * u, with Highway's Exp. A short tail goes through the same
// vector code via a padded copy, so every element gets the same arithmetic.
void SwigluF32(const float* g, const float* u, float* out, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto one = hn::Set(d, 1.0f), lo = hn::Set(d, -87.0f), hi = hn::Set(d, 88.0f);
  auto step = [&](const float* gp, const float* up, float* op) {
    const auto gv = hn::LoadU(d, gp);
    // Exp's valid range is bounded: e^-87 is already ~1e-38 (silu(g) = g) and e^88 ~ 2e38 (silu ~ 0).
    const auto e = hn::Exp(d, hn::Min(hn::Max(hn::Neg(gv), lo), hi));
    hn::StoreU(hn::Mul(hn::Div(gv, hn::Add(one, e)), hn::LoadU(d, up)), d, op);
  };
  size_t i = 0;
  for (; i + N <= n; i += N) step(g + i, u + i, out + i);
  if (i < n) {
    HWY_ALIGN float gt[hn::MaxLanes(d)] = {}, ut[hn::MaxLanes(d)] = {}, ot[hn::MaxLanes(d)];
    for (size_t j = i; j < n; ++j) gt[j - i] = g[j], ut[j - i] = u[j];
    step(gt, ut, ot);
    for (size_t j = i; j < n; ++j) out[j] = ot[j - i];
  }
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace towers::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace towers::simd {
HWY_EXPORT(DotF32);
HWY_EXPORT(AxpyF32);
HWY_EXPORT(TargetName);
HWY_EXPORT(SwigluF32);

float dot_f32(const float* a, const float* b, size_t n) { return HWY_DYNAMIC_DISPATCH(DotF32)(a, b, n); }
void axpy_f32(float alpha, const float* x, float* y, size_t n) {
  HWY_DYNAMIC_DISPATCH(AxpyF32)(alpha, x, y, n);
}
void swiglu_f32(const float* g, const float* u, float* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(SwigluF32)(g, u, out, n);
}
const char* target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }
}  // namespace towers::simd
#endif
