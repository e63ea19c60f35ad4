// gemm_q (simd/quant_dot.h): ggml weight rows in their file layout times quantized activation rows,
// one weight row at a time against up to 4 activation rows. Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL
// against A32; Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS against A256 (Q2_K, Q3_K and IQ4_XS in
// gemm_q_lowbit-inl.h). Integer dot products per block, scaled and accumulated in f32.
#include "simd/quant_dot.h"

// The quant_dot files also compile Highway's AVX3_DL target (quant_dot_target).
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL 1
#endif

#include <algorithm>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/gemm_q.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd/gemm_q_lowbit-inl.h"
#include "simd/quant_dot-inl.h"
#include "simd/quant_layout.h"

#ifndef TOWERS_SIMD_GEMM_Q_ONCE
#define TOWERS_SIMD_GEMM_Q_ONCE
namespace towers::simd::qd {
// Q5_0's fifth bits: lane k of 16 tests bit k.
alignas(64) inline constexpr uint16_t kBitSel[16] = {1,    2,    4,    8,     16,    32,    64,    128,
                                                     256,  512,  1024, 2048,  4096,  8192,  16384, 32768};
}  // namespace towers::simd::qd
#endif

HWY_BEFORE_NAMESPACE();
namespace towers::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace qd;  // NOLINT

// The pointers of activation rows 0..3 (A always has kMaxR entries; unused ones repeat row 0):
// aq_i, ad_i (both layouts), ds_i (A32) and bs_i (A256).
#define TOWERS_ACT_PTRS(i)                     \
  const int16_t* HWY_RESTRICT aq##i = A[i].q;  \
  const float* HWY_RESTRICT ad##i = A[i].d;    \
  const float* HWY_RESTRICT ds##i = A[i].ds;   \
  const int16_t* HWY_RESTRICT bs##i = A[i].bs; \
  (void)aq##i, (void)ad##i, (void)ds##i, (void)bs##i;
#define TOWERS_ACT_PTRS4 TOWERS_ACT_PTRS(0) TOWERS_ACT_PTRS(1) TOWERS_ACT_PTRS(2) TOWERS_ACT_PTRS(3)

// ---------------------------------------------------------------------------------------------
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL (blocks of 32) against A32 activations.
// Per block: int32 lanes of q_w * q_x, converted to f32, times (d_w * d_x), added to an f32 vector.
// Even and odd blocks go to separate accumulators (two dependency chains), summed at the end.

template <GgmlType kType, size_t R, class D16, class V32>
HWY_INLINE void LegacyBlockDots(D16 d16, const BlockOf<kType>& blk,
                                const int16_t* HWY_RESTRICT aq0, const int16_t* HWY_RESTRICT aq1,
                                const int16_t* HWY_RESTRICT aq2, const int16_t* HWY_RESTRICT aq3,
                                V32& s0, V32& s1, V32& s2, V32& s3) {
  const hn::RebindToUnsigned<D16> du16;
  const hn::Rebind<uint8_t, D16> du8;
  const hn::Rebind<int8_t, D16> di8;
  const hn::Repartition<int32_t, D16> d32;
  const size_t N = hn::Lanes(d16);
  s0 = hn::Zero(d32), s1 = s0, s2 = s0, s3 = s0;
  auto u0 = s0, u1 = s0, u2 = s0, u3 = s0;
  if constexpr (kType == kQ8_0) {
    const int8_t* HWY_RESTRICT qs = blk.qs;
    for (size_t j = 0; j < 32; j += N) {
      const auto wv = hn::PromoteTo(d16, hn::LoadU(di8, qs + j));
#define TOWERS_MAC(i) s##i = hn::ReorderWidenMulAccumulate(d32, wv, hn::LoadU(d16, aq##i + j), s##i, u##i);
      TOWERS_EACH_R(TOWERS_MAC)
#undef TOWERS_MAC
    }
  } else if constexpr (kType == kIQ4_NL) {
    const auto k15 = hn::Set(du8, uint8_t{15});
    for (size_t j = 0; j < 16; j += N) {
      const auto bytes = hn::LoadU(du8, blk.qs + j);
      const auto wl = Iq4Values(d16, hn::And(bytes, k15));  // elements j..
      const auto wh = Iq4Values(d16, hn::ShiftRight<4>(bytes));  // elements 16+j..
#define TOWERS_MAC(i)                                                                         \
  s##i = hn::ReorderWidenMulAccumulate(d32, wl, hn::LoadU(d16, aq##i + j), s##i, u##i);      \
  s##i = hn::ReorderWidenMulAccumulate(d32, wh, hn::LoadU(d16, aq##i + 16 + j), s##i, u##i);
      TOWERS_EACH_R(TOWERS_MAC)
#undef TOWERS_MAC
    }
  } else {
    const uint8_t* HWY_RESTRICT qs = blk.qs;
    uint32_t qh = 0;
    if constexpr (kType == kQ5_0 || kType == kQ5_1) std::memcpy(&qh, blk.qh, 4);
    const auto k15 = hn::Set(du16, uint16_t{15});
    for (size_t j = 0; j < 16; j += N) {
      const auto bytes = hn::PromoteTo(du16, hn::LoadU(du8, qs + j));
      auto lo = hn::And(bytes, k15);       // elements j..
      auto hi = hn::ShiftRight<4>(bytes);  // elements 16+j..
      if constexpr (kType == kQ5_0 || kType == kQ5_1) {  // q | bit*16, minus 16 for Q5_0
        const auto k16 = hn::Set(du16, uint16_t{16});
        const auto sel = hn::LoadU(du16, kBitSel);
        const auto hl = hn::Set(du16, static_cast<uint16_t>(qh >> j));
        const auto hh = hn::Set(du16, static_cast<uint16_t>(qh >> (16 + j)));
        lo = hn::Or(lo, hn::IfThenElseZero(hn::TestBit(hl, sel), k16));
        hi = hn::Or(hi, hn::IfThenElseZero(hn::TestBit(hh, sel), k16));
        if constexpr (kType == kQ5_0) {
          lo = hn::Sub(lo, k16);
          hi = hn::Sub(hi, k16);
        }
      } else if constexpr (kType == kQ4_0) {
        const auto k8 = hn::Set(du16, uint16_t{8});
        lo = hn::Sub(lo, k8);
        hi = hn::Sub(hi, k8);
      }
      const auto wl = hn::BitCast(d16, lo);
      const auto wh = hn::BitCast(d16, hi);
#define TOWERS_MAC(i)                                                                         \
  s##i = hn::ReorderWidenMulAccumulate(d32, wl, hn::LoadU(d16, aq##i + j), s##i, u##i);      \
  s##i = hn::ReorderWidenMulAccumulate(d32, wh, hn::LoadU(d16, aq##i + 16 + j), s##i, u##i);
      TOWERS_EACH_R(TOWERS_MAC)
#undef TOWERS_MAC
    }
  }
#define TOWERS_FIN(i) s##i = hn::RearrangeToOddPlusEven(s##i, u##i);
  TOWERS_EACH_R(TOWERS_FIN)
#undef TOWERS_FIN
}

template <GgmlType kType, size_t R>
HWY_NOINLINE void RowLegacy(const BlockOf<kType>* HWY_RESTRICT w, const ActRow* A, size_t nb,
                            float* HWY_RESTRICT out) {
  constexpr size_t kCap = (kType == kQ8_0) ? 32 : 16;
  const hn::CappedTag<int16_t, kCap> d16;
  const hn::Repartition<float, decltype(d16)> df;

  TOWERS_ACT_PTRS4

  auto accA0 = hn::Zero(df), accA1 = accA0, accA2 = accA0, accA3 = accA0;
  auto accB0 = accA0, accB1 = accA0, accB2 = accA0, accB3 = accA0;
  constexpr bool kAffine = kType == kQ4_1 || kType == kQ5_1;  // x = d * q + m
  float mA0 = 0.f, mA1 = 0.f, mA2 = 0.f, mA3 = 0.f;  // their m terms
  float mB0 = 0.f, mB1 = 0.f, mB2 = 0.f, mB3 = 0.f;
  (void)mA1, (void)mA2, (void)mA3, (void)mB1, (void)mB2, (void)mB3;
  hn::Vec<hn::Repartition<int32_t, decltype(d16)>> s0, s1, s2, s3;

#define TOWERS_BLOCK(AB, bi)                                                                    \
  {                                                                                             \
    const size_t bb = (bi);                                                                     \
    const BlockOf<kType>& blk = w[bb];                                                          \
    const size_t e = bb * 32;                                                                   \
    LegacyBlockDots<kType, R>(d16, blk, aq0 + e, aq1 + e, aq2 + e, aq3 + e, s0, s1, s2, s3);    \
    const float dw = LoadF16(blk.d);                                                            \
    float mw = 0.f;                                                                             \
    if constexpr (kAffine) mw = LoadF16(blk.m);                                                 \
    (void)mw;                                                                                   \
    TOWERS_EACH_R(TOWERS_ACC_##AB)                                                              \
  }
#define TOWERS_ACC_A(i)                                                                    \
  accA##i = hn::MulAdd(hn::Set(df, dw * ad##i[bb]), hn::ConvertTo(df, s##i), accA##i);     \
  if constexpr (kAffine) mA##i += mw * ds##i[bb];
#define TOWERS_ACC_B(i)                                                                    \
  accB##i = hn::MulAdd(hn::Set(df, dw * ad##i[bb]), hn::ConvertTo(df, s##i), accB##i);     \
  if constexpr (kAffine) mB##i += mw * ds##i[bb];

  size_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    TOWERS_BLOCK(A, b)
    TOWERS_BLOCK(B, b + 1)
  }
  if (b < nb) TOWERS_BLOCK(A, b)
#undef TOWERS_ACC_A
#undef TOWERS_ACC_B
#undef TOWERS_BLOCK

#define TOWERS_OUT(i) out[i] = hn::GetLane(hn::SumOfLanes(df, hn::Add(accA##i, accB##i))) + (mA##i + mB##i);
  TOWERS_EACH_R(TOWERS_OUT)
#undef TOWERS_OUT
}

// ---------------------------------------------------------------------------------------------
// Q4_K and Q5_K (blocks of 256 = 8 sub-blocks of 32, 6-bit scale and min each) against A256.
// The sub-block scale multiplies the weights in int16 (q*sc <= 31*63), so the whole block sums
// in int32; the min term is an int16 dot of the 8 mins with the activation's 32-element sums.

template <GgmlType kType, size_t R>
HWY_NOINLINE void RowK45(const BlockOf<kType>* HWY_RESTRICT w, const ActRow* A, size_t nb,
                         float* HWY_RESTRICT out) {
  const hn::CappedTag<int16_t, 32> d16;
  const hn::RebindToUnsigned<decltype(d16)> du16;
  const hn::Rebind<uint8_t, decltype(d16)> du8;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  const hn::Repartition<float, decltype(d16)> df;
  const size_t N = hn::Lanes(d16);
  // The min term: 8 int16 lanes (or fewer, looped).
  const hn::CappedTag<int16_t, 8> m16;
  const hn::Rebind<uint8_t, decltype(m16)> mu8;
  const hn::Repartition<int32_t, decltype(m16)> m32;
  const hn::Repartition<float, decltype(m16)> mf;
  const size_t NM = hn::Lanes(m16);

  TOWERS_ACT_PTRS4

  auto acc0 = hn::Zero(df), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  auto macc0 = hn::Zero(mf), macc1 = macc0, macc2 = macc0, macc3 = macc0;
  const auto k15 = hn::Set(du16, uint16_t{15});
  const auto k16 = hn::Set(du16, uint16_t{16});
  (void)k16;

  for (size_t b = 0; b < nb; ++b) {
    const BlockOf<kType>& blk = w[b];
    const float d = LoadF16(blk.d);
    const float dmin = LoadF16(blk.dmin);
    HWY_ALIGN uint8_t sc[8];
    HWY_ALIGN uint8_t mn[8];
    unpack_scale_min_k4(blk.scales, sc, mn);
    HWY_ALIGN uint32_t sc2[16];
    ScalePairs<8>(sc, sc2);
    const uint8_t* HWY_RESTRICT qs = blk.qs;
    const uint8_t* HWY_RESTRICT qh = nullptr;  // Q5_K's fifth bits
    if constexpr (kType == kQ5_K) qh = blk.qh;
    const size_t e0 = b * 256;
    auto s0 = hn::Zero(d32), s1 = s0, s2 = s0, s3 = s0;
    auto u0 = s0, u1 = s0, u2 = s0, u3 = s0;
#define TOWERS_MAC(i)                                                                         \
  s##i = hn::ReorderWidenMulAccumulate(d32, wl, hn::LoadU(d16, aq##i + e), s##i, u##i);       \
  s##i = hn::ReorderWidenMulAccumulate(d32, wh, hn::LoadU(d16, aq##i + e + 32), s##i, u##i);
#define TOWERS_K45_LOOPS(UNROLL)                                                              \
  UNROLL for (size_t c = 0; c < 4; ++c) {                                                    \
    const auto vsl = SetPair(du16, sc2[2 * c]);                                              \
    const auto vsh = SetPair(du16, sc2[2 * c + 1]);                                          \
    UNROLL for (size_t j = 0; j < 32; j += N) {                                              \
      const auto bytes = hn::PromoteTo(du16, hn::LoadU(du8, qs + 32 * c + j));               \
      auto lo = hn::And(bytes, k15);      /* elements 64c + j.. */                           \
      auto hi = hn::ShiftRight<4>(bytes); /* elements 64c + 32 + j.. */                      \
      if constexpr (kType == kQ5_K) {                                                        \
        const auto h = hn::ShiftRightSame(hn::PromoteTo(du16, hn::LoadU(du8, qh + j)),       \
                                          static_cast<int>(2 * c));                          \
        lo = hn::Or(lo, hn::And(hn::ShiftLeft<4>(h), k16));                                  \
        hi = hn::Or(hi, hn::And(hn::ShiftLeft<3>(h), k16));                                  \
      }                                                                                      \
      const auto wl = hn::BitCast(d16, hn::Mul(lo, vsl));                                    \
      const auto wh = hn::BitCast(d16, hn::Mul(hi, vsh));                                    \
      const size_t e = e0 + 64 * c + j;                                                      \
      TOWERS_EACH_R(TOWERS_MAC)                                                              \
    }                                                                                        \
  }
    // One activation row: fully unrolled (measurably faster). Four: rolled (unrolling spills).
    if constexpr (R == 1) {
      TOWERS_K45_LOOPS(_Pragma("GCC unroll 16"))
    } else {
      TOWERS_K45_LOOPS()
    }
#undef TOWERS_K45_LOOPS
#undef TOWERS_MAC
    // sum_g mn[g] * bsum32[g], as int32 lanes (exact).
    auto ms0 = hn::Zero(m32), ms1 = ms0, ms2 = ms0, ms3 = ms0;
    auto mu0 = ms0, mu1 = ms0, mu2 = ms0, mu3 = ms0;
    for (size_t g = 0; g < 8; g += NM) {
      const auto mv = hn::BitCast(m16, hn::PromoteTo(hn::RebindToUnsigned<decltype(m16)>(), hn::LoadU(mu8, mn + g)));
#define TOWERS_MIN(i) ms##i = hn::ReorderWidenMulAccumulate(m32, mv, hn::LoadU(m16, bs##i + b * 8 + g), ms##i, mu##i);
      TOWERS_EACH_R(TOWERS_MIN)
#undef TOWERS_MIN
    }
#define TOWERS_ACC(i)                                                                          \
  {                                                                                            \
    const float dx = ad##i[b];                                                                 \
    acc##i = hn::MulAdd(hn::Set(df, d * dx),                                                   \
                        hn::ConvertTo(df, hn::RearrangeToOddPlusEven(s##i, u##i)), acc##i);    \
    macc##i = hn::MulAdd(hn::Set(mf, dmin * dx),                                               \
                         hn::ConvertTo(mf, hn::RearrangeToOddPlusEven(ms##i, mu##i)), macc##i); \
  }
    TOWERS_EACH_R(TOWERS_ACC)
#undef TOWERS_ACC
  }
#define TOWERS_OUT(i) \
  out[i] = hn::GetLane(hn::SumOfLanes(df, acc##i)) - hn::GetLane(hn::SumOfLanes(mf, macc##i));
  TOWERS_EACH_R(TOWERS_OUT)
#undef TOWERS_OUT
}

// ---------------------------------------------------------------------------------------------
// Q6_K (blocks of 256 = 16 groups of 16 with int8 scales) against A256. (q-32)*sc fits int16.
template <size_t R>
HWY_NOINLINE void RowQ6K(const BlockQ6_K* HWY_RESTRICT w, const ActRow* A, size_t nb,
                         float* HWY_RESTRICT out) {
  const hn::CappedTag<int16_t, 16> d16;  // a vector never straddles two 16-element groups
  const hn::RebindToUnsigned<decltype(d16)> du16;
  const hn::Rebind<uint8_t, decltype(d16)> du8;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  const hn::Repartition<float, decltype(d16)> df;
  const size_t N = hn::Lanes(d16);

  TOWERS_ACT_PTRS4

  auto acc0 = hn::Zero(df), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  const auto k15 = hn::Set(du16, uint16_t{15});
  const auto k48 = hn::Set(du16, uint16_t{48});
  const auto k32 = hn::Set(du16, uint16_t{32});

  for (size_t b = 0; b < nb; ++b) {
    const BlockQ6_K& blk = w[b];
    const int8_t* HWY_RESTRICT scales = blk.scales;
    const float d = LoadF16(blk.d);
    HWY_ALIGN uint32_t sc2[16];
    ScalePairs<16>(scales, sc2);
    const size_t e0 = b * 256;
    auto s0 = hn::Zero(d32), s1 = s0, s2 = s0, s3 = s0;
    auto u0 = s0, u1 = s0, u2 = s0, u3 = s0;
    for (size_t h = 0; h < 2; ++h) {
      const uint8_t* HWY_RESTRICT ql = blk.ql + 64 * h;
      const uint8_t* HWY_RESTRICT qh = blk.qh + 32 * h;
      for (size_t j = 0; j < 32; j += N) {
        const auto la = hn::PromoteTo(du16, hn::LoadU(du8, ql + j));
        const auto lb = hn::PromoteTo(du16, hn::LoadU(du8, ql + 32 + j));
        const auto hb = hn::PromoteTo(du16, hn::LoadU(du8, qh + j));
        const auto q1 = hn::Sub(hn::Or(hn::And(la, k15), hn::And(hn::ShiftLeft<4>(hb), k48)), k32);
        const auto q2 = hn::Sub(hn::Or(hn::And(lb, k15), hn::And(hn::ShiftLeft<2>(hb), k48)), k32);
        const auto q3 = hn::Sub(hn::Or(hn::ShiftRight<4>(la), hn::And(hb, k48)), k32);
        const auto q4 = hn::Sub(hn::Or(hn::ShiftRight<4>(lb), hn::And(hn::ShiftRight<2>(hb), k48)), k32);
        const size_t is = j / 16;
        const auto w1 = hn::Mul(hn::BitCast(d16, q1), SetPair(d16, sc2[8 * h + is + 0]));
        const auto w2 = hn::Mul(hn::BitCast(d16, q2), SetPair(d16, sc2[8 * h + is + 2]));
        const auto w3 = hn::Mul(hn::BitCast(d16, q3), SetPair(d16, sc2[8 * h + is + 4]));
        const auto w4 = hn::Mul(hn::BitCast(d16, q4), SetPair(d16, sc2[8 * h + is + 6]));
        const size_t e = e0 + 128 * h + j;
#define TOWERS_MAC(i)                                                                         \
  s##i = hn::ReorderWidenMulAccumulate(d32, w1, hn::LoadU(d16, aq##i + e), s##i, u##i);       \
  s##i = hn::ReorderWidenMulAccumulate(d32, w2, hn::LoadU(d16, aq##i + e + 32), s##i, u##i);  \
  s##i = hn::ReorderWidenMulAccumulate(d32, w3, hn::LoadU(d16, aq##i + e + 64), s##i, u##i);  \
  s##i = hn::ReorderWidenMulAccumulate(d32, w4, hn::LoadU(d16, aq##i + e + 96), s##i, u##i);
        TOWERS_EACH_R(TOWERS_MAC)
#undef TOWERS_MAC
      }
    }
#define TOWERS_ACC(i)                                                                       \
  acc##i = hn::MulAdd(hn::Set(df, d * ad##i[b]),                                            \
                      hn::ConvertTo(df, hn::RearrangeToOddPlusEven(s##i, u##i)), acc##i);
    TOWERS_EACH_R(TOWERS_ACC)
#undef TOWERS_ACC
  }
#define TOWERS_OUT(i) out[i] = hn::GetLane(hn::SumOfLanes(df, acc##i));
  TOWERS_EACH_R(TOWERS_OUT)
#undef TOWERS_OUT
}

template <GgmlType kType, size_t R>
HWY_INLINE void RowDot(const uint8_t* w, const ActRow* A, size_t n, float* out) {
  const auto* blocks = reinterpret_cast<const BlockOf<kType>*>(w);
  if constexpr (kType == kQ4_K || kType == kQ5_K) {
    RowK45<kType, R>(blocks, A, n / kQK_K, out);
  } else if constexpr (kType == kQ6_K) {
    RowQ6K<R>(blocks, A, n / kQK_K, out);
  } else if constexpr (kType == kQ2_K || kType == kQ3_K) {
    RowQ23K<kType, R>(blocks, A, n / kQK_K, out);
  } else if constexpr (kType == kIQ4_XS) {
    RowIQ4XS<R>(blocks, A, n / kQK_K, out);
  } else {
    RowLegacy<kType, R>(blocks, A, n / kQK, out);
  }
}

template <GgmlType kType>
void GemmType(const uint8_t* w, size_t row_stride, size_t rows, const uint8_t* act,
              size_t act_stride, size_t T, size_t n, float* y, size_t ldy) {
  // Tiling for large T: keep a panel of activation rows and a panel of weight rows within L2.
  // It only changes which (row, t) pairs are computed when, never how.
  constexpr size_t kActBudget = 384 * 1024, kWeightBudget = 256 * 1024;
  size_t tb = T, rb = rows;
  if (T * act_stride > kActBudget) {
    tb = std::max<size_t>(kMaxR, (kActBudget / act_stride) / kMaxR * kMaxR);
    rb = std::max<size_t>(1, kWeightBudget / std::max<size_t>(1, row_stride));
  }
  for (size_t r0 = 0; r0 < rows; r0 += rb) {
    const size_t r1 = std::min(rows, r0 + rb);
    for (size_t t0 = 0; t0 < T; t0 += tb) {
      const size_t t1 = std::min(T, t0 + tb);
      for (size_t r = r0; r < r1; ++r) {
        const uint8_t* wr = w + r * row_stride;
        for (size_t t = t0; t < t1; t += kMaxR) {
          const size_t cnt = std::min(kMaxR, t1 - t);
          ActRow A[kMaxR];
          for (size_t i = 0; i < kMaxR; ++i) {
            A[i] = act_row(kType, act + (t + (i < cnt ? i : 0)) * act_stride, n);
          }
          float out[kMaxR];
          switch (cnt) {
            case 4: RowDot<kType, 4>(wr, A, n, out); break;
            case 3: RowDot<kType, 3>(wr, A, n, out); break;
            case 2: RowDot<kType, 2>(wr, A, n, out); break;
            default: RowDot<kType, 1>(wr, A, n, out); break;
          }
          for (size_t i = 0; i < cnt; ++i) y[(t + i) * ldy + r] = out[i];
        }
      }
    }
  }
}

void GemmQ(uint32_t type, const void* w, size_t row_stride, size_t rows, const void* act,
           size_t act_stride, size_t T, size_t n, float* y, size_t ldy) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(act);
  switch (static_cast<GgmlType>(type)) {
    case kQ4_0: return GemmType<kQ4_0>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kQ4_1: return GemmType<kQ4_1>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kQ5_0: return GemmType<kQ5_0>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kQ5_1: return GemmType<kQ5_1>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kIQ4_NL: return GemmType<kIQ4_NL>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kQ2_K: return GemmType<kQ2_K>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kQ3_K: return GemmType<kQ3_K>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kIQ4_XS: return GemmType<kIQ4_XS>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kQ8_0: return GemmType<kQ8_0>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kQ4_K: return GemmType<kQ4_K>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kQ5_K: return GemmType<kQ5_K>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kQ6_K: return GemmType<kQ6_K>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    default: return;
  }
}

#undef TOWERS_ACT_PTRS4
#undef TOWERS_ACT_PTRS

}  // namespace HWY_NAMESPACE
}  // namespace towers::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace towers::simd {
HWY_EXPORT(GemmQ);

void gemm_q(uint32_t t, const void* w, size_t row_stride, size_t rows, const void* act,
            size_t act_stride, size_t T, size_t n, float* y, size_t ldy) {
  if (!has_quant_dot(t) || rows == 0 || T == 0) return;
  HWY_DYNAMIC_DISPATCH(GemmQ)(t, w, row_stride, rows, act, act_stride, T, n, y, ldy);
}
}  // namespace towers::simd
#endif
