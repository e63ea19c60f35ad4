// quantize_act (simd/quant_dot.h): f32 activation rows to the A32 / A256 layouts that gemm_q and
// gemm_packed read.
#include "simd/quant_dot.h"

#include <cmath>

// The quant_dot files also compile Highway's AVX3_DL target (quant_dot_target).
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL 1
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/quant_act.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd/f16.h"
#include "simd/quant_layout.h"

HWY_BEFORE_NAMESPACE();
namespace towers::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace qd;  // NOLINT

// The value ggml's f16 field would hold (nearest, ties to even; scalar, one per block, so every target
// rounds alike), where f16 holds it to 11 bits: outside [2^-14, 65504] ggml's block would lose it to a
// subnormal, zero or infinity (a NaN dot product), and the f32 value stays.
HWY_INLINE float round_to_f16(float v) {
  const float a = std::fabs(v);
  if (!(a >= 0x1p-14f && a <= 65504.0f)) return v;
  return fp16_to_f32(f32_to_fp16(v));
}

// Per block d = amax/127, q = nearest_even(x * 127/amax); A32's d and ds rounded to f16 for ActScales::F16.
void QuantizeAct(uint32_t type, const float* HWY_RESTRICT x, void* act, size_t n, bool f16_scales) {
  const GgmlType t = static_cast<GgmlType>(type);
  const size_t B = act_block(t);
  const size_t nb = n / B;
  const ActOffsets o = act_offsets(t, n);
  auto* p = static_cast<uint8_t*>(act);
  int16_t* HWY_RESTRICT q = reinterpret_cast<int16_t*>(p);
  float* HWY_RESTRICT d = reinterpret_cast<float*>(p + o.d);
  float* HWY_RESTRICT ds = d + nb;                                   // A32 (o.ds)
  int32_t* HWY_RESTRICT si = reinterpret_cast<int32_t*>(ds + nb);    // A32 (o.s)
  int16_t* HWY_RESTRICT bs = reinterpret_cast<int16_t*>(p + o.bs);  // A256
  int8_t* HWY_RESTRICT q8 = reinterpret_cast<int8_t*>(p + o.q8);
  const hn::CappedTag<float, 32> df;
  const hn::Rebind<int32_t, decltype(df)> di32;
  const hn::Rebind<int16_t, decltype(df)> di16;
  const hn::Rebind<int8_t, decltype(df)> di8;
  const size_t N = hn::Lanes(df);
  for (size_t b = 0; b < nb; ++b) {
    const float* HWY_RESTRICT xb = x + b * B;
    int16_t* HWY_RESTRICT qb = q + b * B;
    auto vmax = hn::Zero(df);
    for (size_t i = 0; i < B; i += N) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, xb + i)));
    const float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
    // Blocks below 1e-30 (and only those) become zeros, so 127/amax stays finite.
    const bool zero = !(amax >= 1e-30f);
    const float db = zero ? 0.f : amax / 127.0f;
    const auto vid = hn::Set(df, zero ? 0.f : 127.0f / amax);
    // ggml rounds its Q8_0/Q8_1 block scale to f16 after quantizing with the f32 one (q is the same).
    d[b] = f16_scales && B == 32 ? round_to_f16(db) : db;
    for (size_t g = 0; g < B; g += 32) {  // 32-element groups: quantize, store, sum
      auto vsum = hn::Zero(di32);
      for (size_t i = g; i < g + 32; i += N) {
        const auto qi = hn::NearestInt(hn::Mul(hn::LoadU(df, xb + i), vid));
        vsum = hn::Add(vsum, qi);
        hn::StoreU(hn::DemoteTo(di16, qi), di16, qb + i);
        hn::StoreU(hn::DemoteTo(di8, qi), di8, q8 + b * B + i);
      }
      const int32_t sum = hn::GetLane(hn::SumOfLanes(di32, vsum));
      if (B == 32) {
        const float dsum = db * static_cast<float>(sum);
        ds[b] = f16_scales ? round_to_f16(dsum) : dsum;
        si[b] = sum;
      } else {
        bs[b * 8 + g / 32] = static_cast<int16_t>(sum);
      }
    }
    if (B == 256) {  // the 16-element sums (exact; |sum| <= 16 * 127)
      int16_t* HWY_RESTRICT bs16 = reinterpret_cast<int16_t*>(p + o.bs16) + b * 16;
      const int8_t* HWY_RESTRICT qg = q8 + b * B;
      for (size_t h = 0; h < 16; ++h) {
        int sum = 0;
        for (size_t i = 0; i < 16; ++i) sum += qg[16 * h + i];
        bs16[h] = static_cast<int16_t>(sum);
      }
    }
  }
}


}  // namespace HWY_NAMESPACE
}  // namespace towers::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace towers::simd {
HWY_EXPORT(QuantizeAct);

bool has_quant_dot(uint32_t t) { return qd::has_kernel(static_cast<GgmlType>(t)); }

size_t act_bytes(uint32_t t, size_t n) {
  return has_quant_dot(t) ? qd::act_offsets(static_cast<GgmlType>(t), n).bytes : 0;
}

void quantize_act(uint32_t t, const float* x, void* act, size_t n, ActScales scales) {
  if (!has_quant_dot(t)) return;
  HWY_DYNAMIC_DISPATCH(QuantizeAct)(t, x, act, n, scales == ActScales::F16);
}
}  // namespace towers::simd
#endif
