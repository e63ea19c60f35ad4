#include "simd/ops.h"

#include "simd/f16.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

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

// Runs step(g, u, out) over whole vectors of the gate's inputs, then over a zero-padded copy of the
// short tail, so that every element gets the same arithmetic.
template <class D, class Step>
HWY_INLINE void GateLoop(D d, const float* g, const float* u, float* out, size_t n, Step step) {
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) step(g + i, u + i, out + i);
  if (i < n) {
    HWY_ALIGN float gt[hn::MaxLanes(d)] = {}, ut[hn::MaxLanes(d)] = {}, ot[hn::MaxLanes(d)];
    for (size_t j = i; j < n; ++j) gt[j - i] = g[j], ut[j - i] = u[j];
    step(gt, ut, ot);
    for (size_t j = i; j < n; ++j) out[j] = ot[j - i];
  }
}

// out = silu(g) * u = g / (1 + e^-g) * u, with Highway's Exp.
void SwigluF32(const float* g, const float* u, float* out, size_t n) {
  const hn::ScalableTag<float> d;
  const auto one = hn::Set(d, 1.0f), lo = hn::Set(d, -87.0f), hi = hn::Set(d, 88.0f);
  GateLoop(d, g, u, out, n, [&](const float* gp, const float* up, float* op) {
    const auto gv = hn::LoadU(d, gp);
    // Exp's valid range is bounded: e^-87 is already ~1e-38 (silu(g) = g) and e^88 ~ 2e38 (silu ~ 0).
    const auto e = hn::Exp(d, hn::Min(hn::Max(hn::Neg(gv), lo), hi));
    hn::StoreU(hn::Mul(hn::Div(gv, hn::Add(one, e)), hn::LoadU(d, up)), d, op);
  });
}

// out = gelu_tanh(g) * u. 0.5 (1 + tanh(z)) is computed as 1 / (1 + e^-2z), the same function without
// the cancellation of 1 + tanh(z) for negative z (where it would lose every digit below g ~ -5).
void GegluF32(const float* g, const float* u, float* out, size_t n) {
  const hn::ScalableTag<float> d;
  const auto one = hn::Set(d, 1.0f), lo = hn::Set(d, -87.0f), hi = hn::Set(d, 88.0f);
  const auto k0 = hn::Set(d, -2.0f * 0.7978845608028654f), k1 = hn::Set(d, 0.044715f);  // -2 sqrt(2/pi)
  GateLoop(d, g, u, out, n, [&](const float* gp, const float* up, float* op) {
    const auto gv = hn::LoadU(d, gp);
    const auto minus_2z = hn::Mul(k0, hn::MulAdd(hn::Mul(k1, gv), hn::Mul(gv, gv), gv));
    const auto e = hn::Exp(d, hn::Min(hn::Max(minus_2z, lo), hi));
    hn::StoreU(hn::Mul(hn::Div(gv, hn::Add(one, e)), hn::LoadU(d, up)), d, op);
  });
}

void SoftcapF32(float* x, size_t n, float scale, float cap) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto pre = hn::Set(d, scale / cap), vcap = hn::Set(d, cap);
  auto step = [&](float* p) { hn::StoreU(hn::Mul(vcap, hn::Tanh(d, hn::Mul(hn::LoadU(d, p), pre))), d, p); };
  size_t i = 0;
  for (; i + N <= n; i += N) step(x + i);
  if (i < n) {
    HWY_ALIGN float t[hn::MaxLanes(d)] = {};
    for (size_t j = i; j < n; ++j) t[j - i] = x[j];
    step(t);
    for (size_t j = i; j < n; ++j) x[j] = t[j - i];
  }
}

// out = x * (1 / sqrt(mean(x^2) + eps)) * g: the sum of squares is DotF32's (fixed order).
void RmsnormF32(const float* x, const float* g, float* out, size_t n, float eps) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const float scale = 1.0f / std::sqrt(DotF32(x, x, n) / static_cast<float>(n) + eps);
  const auto vs = hn::Set(d, scale);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, x + i), vs), hn::LoadU(d, g + i)), d, out + i);
  for (; i < n; ++i) out[i] = x[i] * scale * g[i];
}

// Pair i = (v[i], v[half + i]) (NeoX) or (v[2i], v[2i + 1]): a' = a cos - b sin, b' = a sin + b cos,
// with separate multiplies and adds (no fused ops, like the scalar tail; -ffp-contract=off).
void RopeF32(float* v, const float* HWY_RESTRICT cs, const float* HWY_RESTRICT sn, size_t half, bool neox) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto rot = [&](hn::Vec<decltype(d)>& a, hn::Vec<decltype(d)>& b, size_t i) {
    const auto c = hn::LoadU(d, cs + i), s = hn::LoadU(d, sn + i);
    const auto a2 = hn::Sub(hn::Mul(a, c), hn::Mul(b, s));
    b = hn::Add(hn::Mul(a, s), hn::Mul(b, c));
    a = a2;
  };
  size_t i = 0;
  if (neox) {
    for (; i + N <= half; i += N) {
      auto a = hn::LoadU(d, v + i), b = hn::LoadU(d, v + half + i);
      rot(a, b, i);
      hn::StoreU(a, d, v + i);
      hn::StoreU(b, d, v + half + i);
    }
  } else {
    for (; i + N <= half; i += N) {
      hn::Vec<decltype(d)> a, b;
      hn::LoadInterleaved2(d, v + 2 * i, a, b);
      rot(a, b, i);
      hn::StoreInterleaved2(a, b, d, v + 2 * i);
    }
  }
  for (; i < half; ++i) {
    float& a = neox ? v[i] : v[2 * i];
    float& b = neox ? v[half + i] : v[2 * i + 1];
    const float x0 = a, x1 = b;
    a = x0 * cs[i] - x1 * sn[i];
    b = x0 * sn[i] + x1 * cs[i];
  }
}

// amax is order-free (max), inv and each product are single roundings, NearestInt rounds half to even
// as lrintf does in the default mode: the scalar formula's bits on every target.
float QuantizeSymmetricF32(const float* HWY_RESTRICT v, int8_t* HWY_RESTRICT q, size_t n, int qmax) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<int8_t, decltype(d)> d8;
  const size_t N = hn::Lanes(d);
  auto vmax = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= n; i += N) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(d, v + i)));
  float amax = hn::GetLane(hn::MaxOfLanes(d, vmax));
  for (; i < n; ++i) amax = std::max(amax, std::fabs(v[i]));
  const float scale = amax / static_cast<float>(qmax);
  const float inv = amax > 0 ? static_cast<float>(qmax) / amax : 0.f;
  const auto vinv = hn::Set(d, inv);
  const auto hi = hn::Set(di, qmax), lo = hn::Set(di, -qmax);
  for (i = 0; i + N <= n; i += N) {
    const auto r = hn::Min(hn::Max(hn::NearestInt(hn::Mul(hn::LoadU(d, v + i), vinv)), lo), hi);
    hn::StoreU(hn::DemoteTo(d8, r), d8, q + i);
  }
  for (; i < n; ++i) q[i] = static_cast<int8_t>(std::clamp<long>(std::lrintf(v[i] * inv), -qmax, qmax));
  return scale;
}

void ScaleI32F32(const int32_t* HWY_RESTRICT s, float a, const float* HWY_RESTRICT w, float* HWY_RESTRICT out,
                 size_t n) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const size_t N = hn::Lanes(d);
  const auto va = hn::Set(d, a);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::Mul(hn::ConvertTo(d, hn::LoadU(di, s + i)), hn::Mul(va, hn::LoadU(d, w + i))), d, out + i);
  }
  for (; i < n; ++i) out[i] = static_cast<float>(s[i]) * (a * w[i]);
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
HWY_EXPORT(GegluF32);
HWY_EXPORT(SoftcapF32);
HWY_EXPORT(RmsnormF32);
HWY_EXPORT(RopeF32);
HWY_EXPORT(QuantizeSymmetricF32);
HWY_EXPORT(ScaleI32F32);

float dot_f32(const float* a, const float* b, size_t n) { return HWY_DYNAMIC_DISPATCH(DotF32)(a, b, n); }
void axpy_f32(float alpha, const float* x, float* y, size_t n) {
  HWY_DYNAMIC_DISPATCH(AxpyF32)(alpha, x, y, n);
}
void swiglu_f32(const float* g, const float* u, float* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(SwigluF32)(g, u, out, n);
}
void geglu_f32(const float* g, const float* u, float* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(GegluF32)(g, u, out, n);
}
namespace {
// gelu_tanh of every f16 value, rounded to f16: ggml's ggml_table_gelu_f16 (GGML_GELU_FP16), computed with
// this target's GegluF32 instead of libm's tanhf (the two agree to an f32 ulp or so, so the f16 values
// differ only where that ulp crosses a rounding boundary).
const std::vector<uint16_t>& gelu_f16_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<float> x(65536), one(65536, 1.0f), y(65536);
    for (uint32_t h = 0; h < 65536; ++h) x[h] = fp16_to_f32(static_cast<uint16_t>(h));
    HWY_DYNAMIC_DISPATCH(GegluF32)(x.data(), one.data(), y.data(), y.size());
    std::vector<uint16_t> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = f32_to_fp16(y[h]);
    return t;
  }();
  return table;
}
}  // namespace

void geglu_f32_ggml(const float* g, const float* u, float* out, size_t n) {
  const uint16_t* table = gelu_f16_table().data();
  for (size_t i = 0; i < n; ++i) {
    const float x = g[i];
    const float y = x <= -10.0f ? 0.0f : x >= 10.0f ? x : fp16_to_f32(table[f32_to_fp16(x)]);
    out[i] = y * u[i];
  }
}
void softcap_f32(float* x, size_t n, float scale, float cap) { HWY_DYNAMIC_DISPATCH(SoftcapF32)(x, n, scale, cap); }
void rmsnorm_f32(const float* x, const float* g, float* out, size_t n, float eps) {
  HWY_DYNAMIC_DISPATCH(RmsnormF32)(x, g, out, n, eps);
}
void rope_f32(float* v, const float* cos, const float* sin, size_t half, bool neox) {
  HWY_DYNAMIC_DISPATCH(RopeF32)(v, cos, sin, half, neox);
}
float quantize_symmetric_f32(const float* v, int8_t* q, size_t n, int qmax) {
  return HWY_DYNAMIC_DISPATCH(QuantizeSymmetricF32)(v, q, n, qmax);
}
void scale_i32_f32(const int32_t* s, float a, const float* w, float* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(ScaleI32F32)(s, a, w, out, n);
}
const char* target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }
}  // namespace towers::simd
#endif
