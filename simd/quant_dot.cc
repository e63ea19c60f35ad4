#include "simd/quant_dot.h"

// Also compile Highway's AVX3_DL target (Icelake-class AVX-512 with VNNI and VBMI2): the packed
// kernels use vpdpbusd there (below). Only this file: the other kernels keep Highway's defaults.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL 1
#endif

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/quant_dot.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/cache_control.h>

// Type ids and block geometry, shared by all targets (defined once).
#ifndef TOWERS_SIMD_QUANT_DOT_CONSTANTS
#define TOWERS_SIMD_QUANT_DOT_CONSTANTS
namespace towers::simd::qd {
constexpr uint32_t kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14;
constexpr bool is_k(uint32_t t) { return t == kQ4_K || t == kQ5_K || t == kQ6_K; }
constexpr size_t block_bytes(uint32_t t) {
  switch (t) {
    case kQ4_0: return 18;
    case kQ4_1: return 20;
    case kQ5_0: return 22;
    case kQ8_0: return 34;
    case kQ4_K: return 144;
    case kQ5_K: return 176;
    case kQ6_K: return 210;
    default: return 0;
  }
}
// Bytes per row and block of the packed layouts (quant_dot.h): Q4_K stores its 12 bytes of 6-bit
// scales and mins as 16 bytes; the others keep the ggml block size.
constexpr size_t packed_block_bytes(uint32_t t) { return t == kQ4_K ? 148 : block_bytes(t); }
// Byte offsets inside one packed Q4_K block of kPackRows rows (quant_dot.h).
constexpr size_t kQ4KDmin = 2 * kPackRows, kQ4KScales = 4 * kPackRows, kQ4KMins = 12 * kPackRows,
                 kQ4KQuants = 20 * kPackRows;
// Activation rows processed together per unpacked weight block (gemm_q).
constexpr size_t kMaxR = 4;
// The packed kernels take up to 8 on targets with 32 vector registers (kPackR, per target).
constexpr size_t kMaxPackR = 8;

// Pointers into one quantized activation row (see the layouts in quant_dot.h).
struct ActRow {
  const int16_t* q;
  const float* d;
  const float* ds;      // A32 only
  const int16_t* bs;    // A256 only: 8 sums of 32 per block
  const int32_t* s;     // A32 only: exact sum of q per block
  const int8_t* q8;     // the same q as int8 (for the VNNI kernels)
  const int16_t* bs16;  // A256 only: 16 sums of 16 per block (the Q6_K scale groups)
};
inline ActRow act_row(uint32_t type, const uint8_t* a, size_t n) {
  ActRow r{};
  r.q = reinterpret_cast<const int16_t*>(a);
  r.d = reinterpret_cast<const float*>(a + 2 * n);
  if (is_k(type)) {
    r.bs = reinterpret_cast<const int16_t*>(a + 2 * n + 4 * (n / 256));
    r.q8 = reinterpret_cast<const int8_t*>(a + 2 * n + 20 * (n / 256));
    r.bs16 = reinterpret_cast<const int16_t*>(a + 3 * n + 20 * (n / 256));
  } else {
    r.ds = r.d + n / 32;
    r.s = reinterpret_cast<const int32_t*>(r.ds + n / 32);
    r.q8 = reinterpret_cast<const int8_t*>(a + 2 * n + 12 * (n / 32));
  }
  return r;
}

// Unpacks the 12 bytes of 6-bit scales and mins (ggml's get_scale_min_k4 for j = 0..7).
// Little-endian (as are all ggml files and every Highway target we build).
inline void ScaleMinK4(const uint8_t* HWY_RESTRICT q, uint8_t* HWY_RESTRICT sc,
                           uint8_t* HWY_RESTRICT mn) {
  uint32_t u[3];
  std::memcpy(u, q, 12);
  constexpr uint32_t k6 = 0x3F3F3F3Fu, k4 = 0x0F0F0F0Fu, k2 = 0x03030303u;
  const uint32_t sc_lo = u[0] & k6;                                  // sc[0..3] = q[0..3] & 63
  const uint32_t mn_lo = u[1] & k6;                                  // mn[0..3] = q[4..7] & 63
  const uint32_t sc_hi = (u[2] & k4) | (((u[0] >> 6) & k2) << 4);    // q[8..11] low | q[0..3] top
  const uint32_t mn_hi = ((u[2] >> 4) & k4) | (((u[1] >> 6) & k2) << 4);  // q[8..11] high | q[4..7] top
  std::memcpy(sc, &sc_lo, 4);
  std::memcpy(sc + 4, &sc_hi, 4);
  std::memcpy(mn, &mn_lo, 4);
  std::memcpy(mn + 4, &mn_hi, 4);
}

alignas(64) inline constexpr uint16_t kBitSel[16] = {1,     2,     4,     8,      16,     32,
                                                     64,    128,   256,   512,    1024,   2048,
                                                     4096,  8192,  16384, 32768};
}  // namespace towers::simd::qd
#endif

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3_DL
// Highway 1.0.3's AVX3_DL target string names "avxvnni" (VEX) rather than "avx512vnni"; its run-time
// check for AVX3_DL does require AVX512_VNNI (CPUID.7.0:ECX[11]), so enabling it here is safe.
#pragma GCC target("avx512vnni")
#endif
namespace towers::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace qd;  // NOLINT

// Expands X(i) for every activation row i < R of the current kernel (R is a template parameter).
// Named variables rather than arrays: SVE vectors cannot live in arrays.
#define TOWERS_EACH_R(X)     \
  X(0)                       \
  if constexpr (R > 1) {     \
    X(1)                     \
  }                          \
  if constexpr (R > 2) {     \
    X(2)                     \
  }                          \
  if constexpr (R > 3) {     \
    X(3)                     \
  }

#define TOWERS_ACT_PTRS(i)          \
  const int16_t* HWY_RESTRICT aq##i = A[i].q; \
  const float* HWY_RESTRICT ad##i = A[i].d;  \
  (void)aq##i;                       \
  (void)ad##i;

// ---------------------------------------------------------------------------------------------
// Q4_0, Q4_1, Q5_0, Q8_0 (blocks of 32) against A32 activations.
// Per block: int32 lanes of q_w * q_x, converted to f32, times (d_w * d_x), added to an f32 vector.
// Even and odd blocks go to separate accumulators (two dependency chains), summed at the end.

// One f32 from an unaligned fp16.
HWY_INLINE float LoadF16(const uint8_t* p) {
  const hn::CappedTag<float, 1> d1;
  const hn::Rebind<hwy::float16_t, decltype(d1)> dh1;
  return hn::GetLane(hn::PromoteTo(d1, hn::LoadU(dh1, reinterpret_cast<const hwy::float16_t*>(p))));
}

// Scales as int16 pairs in uint32 (s | s << 16), so that broadcasting one to all int16 lanes is a
// 32-bit broadcast load rather than a scalar-to-vector move plus a shuffle.
template <size_t kCount, typename T>
HWY_INLINE void ScalePairs(const T* HWY_RESTRICT src, uint32_t* HWY_RESTRICT dst) {
  const hn::CappedTag<int32_t, kCount> d32;
  const hn::Rebind<T, decltype(d32)> ds;
  const auto lo16 = hn::Set(d32, 0xFFFF);
  for (size_t k = 0; k < kCount; k += hn::Lanes(d32)) {
    const auto v = hn::PromoteTo(d32, hn::LoadU(ds, src + k));
    hn::StoreU(hn::Or(hn::And(v, lo16), hn::ShiftLeft<16>(v)), d32, reinterpret_cast<int32_t*>(dst) + k);
  }
}
// All int16 lanes = the scale stored by ScalePairs.
template <class D16>
HWY_INLINE hn::Vec<D16> SetPair(D16 d16, uint32_t pair) {
  const hn::Repartition<uint32_t, D16> du32;
  return hn::BitCast(d16, hn::Set(du32, pair));
}

// Integer dot products of one weight block with up to 4 activation blocks (aq_i point at them).
template <uint32_t kType, size_t R, class D16, class V32>
HWY_INLINE void LegacyBlockDots(D16 d16, const uint8_t* HWY_RESTRICT blk,
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
    const int8_t* HWY_RESTRICT qs = reinterpret_cast<const int8_t*>(blk + 2);
    for (size_t j = 0; j < 32; j += N) {
      const auto wv = hn::PromoteTo(d16, hn::LoadU(di8, qs + j));
#define TOWERS_MAC(i) s##i = hn::ReorderWidenMulAccumulate(d32, wv, hn::LoadU(d16, aq##i + j), s##i, u##i);
      TOWERS_EACH_R(TOWERS_MAC)
#undef TOWERS_MAC
    }
  } else {
    const uint8_t* HWY_RESTRICT qs = blk + (kType == kQ4_0 ? 2 : kType == kQ4_1 ? 4 : 6);
    uint32_t qh = 0;
    if constexpr (kType == kQ5_0) std::memcpy(&qh, blk + 2, 4);
    const auto k15 = hn::Set(du16, uint16_t{15});
    for (size_t j = 0; j < 16; j += N) {
      const auto bytes = hn::PromoteTo(du16, hn::LoadU(du8, qs + j));
      auto lo = hn::And(bytes, k15);       // elements j..
      auto hi = hn::ShiftRight<4>(bytes);  // elements 16+j..
      if constexpr (kType == kQ5_0) {
        const auto k16 = hn::Set(du16, uint16_t{16});
        const auto sel = hn::LoadU(du16, kBitSel);
        const auto hl = hn::Set(du16, static_cast<uint16_t>(qh >> j));
        const auto hh = hn::Set(du16, static_cast<uint16_t>(qh >> (16 + j)));
        // (q | bit*16) - 16 == q - (bit ? 0 : 16)
        lo = hn::Sub(lo, hn::IfThenZeroElse(hn::TestBit(hl, sel), k16));
        hi = hn::Sub(hi, hn::IfThenZeroElse(hn::TestBit(hh, sel), k16));
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

template <uint32_t kType, size_t R>
HWY_NOINLINE void RowLegacy(const uint8_t* HWY_RESTRICT w, const ActRow* A, size_t nb,
                            float* HWY_RESTRICT out) {
  constexpr size_t kCap = (kType == kQ8_0) ? 32 : 16;
  constexpr size_t kBB = block_bytes(kType);
  const hn::CappedTag<int16_t, kCap> d16;
  const hn::Repartition<float, decltype(d16)> df;

  TOWERS_ACT_PTRS(0)
  TOWERS_ACT_PTRS(1)
  TOWERS_ACT_PTRS(2)
  TOWERS_ACT_PTRS(3)
  const float* HWY_RESTRICT ds0 = A[0].ds;
  const float* HWY_RESTRICT ds1 = A[1].ds;
  const float* HWY_RESTRICT ds2 = A[2].ds;
  const float* HWY_RESTRICT ds3 = A[3].ds;
  (void)ds1, (void)ds2, (void)ds3;

  auto accA0 = hn::Zero(df), accA1 = accA0, accA2 = accA0, accA3 = accA0;
  auto accB0 = accA0, accB1 = accA0, accB2 = accA0, accB3 = accA0;
  float mA0 = 0.f, mA1 = 0.f, mA2 = 0.f, mA3 = 0.f;  // Q4_1 min terms
  float mB0 = 0.f, mB1 = 0.f, mB2 = 0.f, mB3 = 0.f;
  (void)mA1, (void)mA2, (void)mA3, (void)mB1, (void)mB2, (void)mB3;
  hn::Vec<hn::Repartition<int32_t, decltype(d16)>> s0, s1, s2, s3;

#define TOWERS_BLOCK(AB, bi)                                                                    \
  {                                                                                             \
    const size_t bb = (bi);                                                                     \
    const uint8_t* HWY_RESTRICT blk = w + bb * kBB;                                             \
    const size_t e = bb * 32;                                                                   \
    LegacyBlockDots<kType, R>(d16, blk, aq0 + e, aq1 + e, aq2 + e, aq3 + e, s0, s1, s2, s3);    \
    const float dw = LoadF16(blk);                                                              \
    float mw = 0.f;                                                                             \
    if constexpr (kType == kQ4_1) mw = LoadF16(blk + 2);                                        \
    (void)mw;                                                                                   \
    TOWERS_EACH_R(TOWERS_ACC_##AB)                                                              \
  }
#define TOWERS_ACC_A(i)                                                                    \
  accA##i = hn::MulAdd(hn::Set(df, dw * ad##i[bb]), hn::ConvertTo(df, s##i), accA##i);     \
  if constexpr (kType == kQ4_1) mA##i += mw * ds##i[bb];
#define TOWERS_ACC_B(i)                                                                    \
  accB##i = hn::MulAdd(hn::Set(df, dw * ad##i[bb]), hn::ConvertTo(df, s##i), accB##i);     \
  if constexpr (kType == kQ4_1) mB##i += mw * ds##i[bb];

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

template <uint32_t kType, size_t R>
HWY_NOINLINE void RowK45(const uint8_t* HWY_RESTRICT w, const ActRow* A, size_t nb,
                         float* HWY_RESTRICT out) {
  constexpr size_t kBB = block_bytes(kType);
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

  TOWERS_ACT_PTRS(0)
  TOWERS_ACT_PTRS(1)
  TOWERS_ACT_PTRS(2)
  TOWERS_ACT_PTRS(3)
  const int16_t* HWY_RESTRICT bs0 = A[0].bs;
  const int16_t* HWY_RESTRICT bs1 = A[1].bs;
  const int16_t* HWY_RESTRICT bs2 = A[2].bs;
  const int16_t* HWY_RESTRICT bs3 = A[3].bs;
  (void)bs1, (void)bs2, (void)bs3;

  auto acc0 = hn::Zero(df), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  auto macc0 = hn::Zero(mf), macc1 = macc0, macc2 = macc0, macc3 = macc0;
  const auto k15 = hn::Set(du16, uint16_t{15});
  const auto k16 = hn::Set(du16, uint16_t{16});
  (void)k16;

  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* HWY_RESTRICT blk = w + b * kBB;
    const float d = LoadF16(blk);
    const float dmin = LoadF16(blk + 2);
    HWY_ALIGN uint8_t sc[8];
    HWY_ALIGN uint8_t mn[8];
    ScaleMinK4(blk + 4, sc, mn);
    HWY_ALIGN uint32_t sc2[16];
    ScalePairs<8>(sc, sc2);
    const uint8_t* HWY_RESTRICT qh = blk + 16;
    const uint8_t* HWY_RESTRICT qs = blk + (kType == kQ5_K ? 48 : 16);
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
HWY_NOINLINE void RowQ6K(const uint8_t* HWY_RESTRICT w, const ActRow* A, size_t nb,
                         float* HWY_RESTRICT out) {
  constexpr size_t kBB = block_bytes(kQ6_K);
  const hn::CappedTag<int16_t, 16> d16;  // a vector never straddles two 16-element groups
  const hn::RebindToUnsigned<decltype(d16)> du16;
  const hn::Rebind<uint8_t, decltype(d16)> du8;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  const hn::Repartition<float, decltype(d16)> df;
  const size_t N = hn::Lanes(d16);

  TOWERS_ACT_PTRS(0)
  TOWERS_ACT_PTRS(1)
  TOWERS_ACT_PTRS(2)
  TOWERS_ACT_PTRS(3)

  auto acc0 = hn::Zero(df), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  const auto k15 = hn::Set(du16, uint16_t{15});
  const auto k48 = hn::Set(du16, uint16_t{48});
  const auto k32 = hn::Set(du16, uint16_t{32});

  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* HWY_RESTRICT blk = w + b * kBB;
    const int8_t* HWY_RESTRICT scales = reinterpret_cast<const int8_t*>(blk + 192);
    const float d = LoadF16(blk + 208);
    HWY_ALIGN uint32_t sc2[16];
    ScalePairs<16>(scales, sc2);
    const size_t e0 = b * 256;
    auto s0 = hn::Zero(d32), s1 = s0, s2 = s0, s3 = s0;
    auto u0 = s0, u1 = s0, u2 = s0, u3 = s0;
    for (size_t h = 0; h < 2; ++h) {
      const uint8_t* HWY_RESTRICT ql = blk + 64 * h;
      const uint8_t* HWY_RESTRICT qh = blk + 128 + 32 * h;
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

template <uint32_t kType, size_t R>
HWY_INLINE void RowDot(const uint8_t* w, const ActRow* A, size_t n, float* out) {
  if constexpr (kType == kQ4_K || kType == kQ5_K) {
    RowK45<kType, R>(w, A, n / 256, out);
  } else if constexpr (kType == kQ6_K) {
    RowQ6K<R>(w, A, n / 256, out);
  } else {
    RowLegacy<kType, R>(w, A, n / 32, out);
  }
}

template <uint32_t kType>
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
  switch (type) {
    case kQ4_0: return GemmType<kQ4_0>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kQ4_1: return GemmType<kQ4_1>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kQ5_0: return GemmType<kQ5_0>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kQ8_0: return GemmType<kQ8_0>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kQ4_K: return GemmType<kQ4_K>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kQ5_K: return GemmType<kQ5_K>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    case kQ6_K: return GemmType<kQ6_K>(wb, row_stride, rows, ab, act_stride, T, n, y, ldy);
    default: return;
  }
}

// ---------------------------------------------------------------------------------------------
// Packed 16-row groups (layout in quant_dot.h): int32 lane r of a slice = row r. Activation pairs
// (two int16 = one int32) are broadcast to all lanes; weights are unpacked once per block and
// applied to up to kPackR (8 with AVX-512's 32 registers, else 4) activation rows. Per (row, token) and block, every type computes exact int32
// sums and then acc += (sum as f32) * (d_w * d_x); Q4_K adds a second such term, its min sum times
// (-dmin_w * d_x). The SCALAR target runs the same arithmetic with plain loops.

// All int32 lanes = the two int16 activation values at p.
template <class D16>
HWY_INLINE hn::Vec<D16> PairAt(D16 d16, const int16_t* HWY_RESTRICT p) {
  const hn::Repartition<int32_t, D16> d32;
  int32_t v;
  std::memcpy(&v, p, 4);
  return hn::BitCast(d16, hn::Set(d32, v));
}

#if HWY_TARGET == HWY_SCALAR
// Exact int32 sums of row r of one packed block (index b) with activation row a: sum (the d_w
// term) and msum (Q4_K's min term; 0 for the other types).
template <uint32_t kType>
HWY_INLINE void ScalarPackedSums(const uint8_t* HWY_RESTRICT blk, size_t r, const ActRow& a, size_t b,
                                 int32_t& sum, int32_t& msum) {
  sum = 0;
  msum = 0;
  if constexpr (kType == kQ6_K) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 2 * kPackRows);
    const int16_t* x = a.q + b * 256;
    for (size_t g = 0; g < 16; ++g) {
      const uint8_t* ql = blk + 2 * kPackRows + 16 * kPackRows + g * 192;
      const uint8_t* qh = ql + 128;
      int32_t gs = 0;
      for (size_t p = 0; p < 4; ++p) {
        for (size_t k = 0; k < 2; ++k) {
          const int L = ql[32 * p + 2 * r + k];
          const int H = qh[32 * (p / 2) + 2 * r + k] >> (4 * (p % 2));
          const int lo = (L & 15) | ((H & 3) << 4), hi = (L >> 4) | (((H >> 2) & 3) << 4);
          gs += (lo - 32) * x[16 * g + 2 * p + k] + (hi - 32) * x[16 * g + 8 + 2 * p + k];
        }
      }
      sum += gs * sc[16 * g + r];
    }
  } else if constexpr (kType == kQ4_K) {
    const int16_t* x = a.q + b * 256;
    for (size_t c = 0; c < 4; ++c) {
      int32_t lo = 0, hi = 0;
      for (size_t p = 0; p < 16; ++p) {
        for (size_t k = 0; k < 2; ++k) {
          const uint8_t byte = blk[kQ4KQuants + 512 * c + 32 * p + 2 * r + k];
          lo += (byte & 15) * x[64 * c + 2 * p + k];
          hi += (byte >> 4) * x[64 * c + 32 + 2 * p + k];
        }
      }
      sum += lo * blk[kQ4KScales + 16 * (2 * c) + r] + hi * blk[kQ4KScales + 16 * (2 * c + 1) + r];
    }
    for (size_t j = 0; j < 8; ++j) msum += blk[kQ4KMins + 32 * (j / 2) + 2 * r + j % 2] * a.bs[8 * b + j];
  } else {
    const uint8_t* qs = blk + 2 * kPackRows;
    const int16_t* x = a.q + b * 32;
    for (size_t p = 0; p < (kType == kQ8_0 ? 16 : 8); ++p) {
      for (size_t k = 0; k < 2; ++k) {
        const uint8_t byte = qs[32 * p + 2 * r + k];
        if constexpr (kType == kQ8_0) {
          sum += static_cast<int8_t>(byte) * x[2 * p + k];
        } else {
          sum += (byte & 15) * x[2 * p + k] + (byte >> 4) * x[16 + 2 * p + k];
        }
      }
    }
    if constexpr (kType == kQ4_0) sum -= 8 * a.s[b];
  }
}

template <uint32_t kType, size_t R>
HWY_NOINLINE void PackedGroup(const uint8_t* HWY_RESTRICT grp, const ActRow* A, size_t nb,
                              float* HWY_RESTRICT y, size_t ldy) {
  constexpr size_t kGB = kPackRows * packed_block_bytes(kType);
  for (size_t i = 0; i < R; ++i) {
    for (size_t r = 0; r < kPackRows; ++r) {
      float acc = 0.f;
      for (size_t b = 0; b < nb; ++b) {
        const uint8_t* blk = grp + b * kGB;
        int32_t sum, msum;
        ScalarPackedSums<kType>(blk, r, A[i], b, sum, msum);
        const float dx = A[i].d[b];
        acc = acc + static_cast<float>(sum) * (LoadF16(blk + 2 * r) * dx);
        if constexpr (kType == kQ4_K) {
          acc = acc + static_cast<float>(msum) * (-LoadF16(blk + kQ4KDmin + 2 * r) * dx);
        }
      }
      y[i * ldy + r] = acc;
    }
  }
}
#else
// Up to 8 activation rows per unpacked weight block where there are 32 vector registers (16 rows x
// 8 tokens = 8 int32 accumulators per slice), else 4. Only the order of work depends on it.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr size_t kPackR = 8;
#else
constexpr size_t kPackR = 4;
#endif

// Expands X(i) for every activation row i < R of a packed kernel (R <= 8; rows 4..7 must be
// declared even when R <= 4, which is why the gemm_q kernels keep TOWERS_EACH_R alone).
#define TOWERS_EACH_P(X) \
  TOWERS_EACH_R(X)       \
  if constexpr (R > 4) { \
    X(4)                 \
  }                      \
  if constexpr (R > 5) { \
    X(5)                 \
  }                      \
  if constexpr (R > 6) { \
    X(6)                 \
  }                      \
  if constexpr (R > 7) { \
    X(7)                 \
  }
// Declarations for all 8 (A always has kMaxPackR entries; unused ones repeat row 0).
#define TOWERS_ALL8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define TOWERS_ACT_AT(i) const int16_t* HWY_RESTRICT aq##i = A[i].q + e; (void)aq##i;
#define TOWERS_V8(v) V32 &v##0, V32 &v##1, V32 &v##2, V32 &v##3, V32 &v##4, V32 &v##5, V32 &v##6, V32 &v##7
#define TOWERS_ZERO8(v, z) auto v##0 = z, v##1 = z, v##2 = z, v##3 = z, v##4 = z, v##5 = z, v##6 = z, v##7 = z;

#if HWY_TARGET == HWY_AVX3_DL
// VNNI (vpdpbusd: u8 x s8, 4 products summed into each int32 lane) for Q4_0, Q8_0 and Q4_K. A
// 64-byte load covers two chunks of the packed layout (rows' byte pairs 2p, 2p+1 and 2p+2, 2p+3);
// one vpermw puts each row's 4 bytes in its int32 lane. The weights are the unsigned operand: Q4_0
// and Q4_K nibbles as they are, Q8_0 + 128 (xor 0x80). The activations' int8 copy (q8) gives the
// signed operand, 4 consecutive elements broadcast to all lanes. Offsets are exact int32 terms:
// Q4_0 -8 * sum(x), Q8_0 -128 * sum(x). Every sum is the same integer as on the other targets.
template <uint32_t kType>
constexpr bool kVnni = kType == kQ4_0 || kType == kQ8_0 || kType == kQ4_K || kType == kQ6_K;

// Lane r (of 16) = words r and 16 + r of v: row r's bytes of chunk p, then of chunk p + 1.
HWY_INLINE __m512i PairChunks(const uint8_t* HWY_RESTRICT p) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(p));
}
HWY_INLINE __m512i Bcast4(const int8_t* HWY_RESTRICT p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
using V512 = hn::Vec512<int32_t>;
HWY_INLINE V512 Dp(V512 acc, __m512i w, const int8_t* HWY_RESTRICT x) {
  return V512{_mm512_dpbusd_epi32(acc.raw, w, Bcast4(x))};
}

template <uint32_t kType, size_t R, class D32, class V32>
HWY_INLINE void PackedSumsVnni(D32 d32, const uint8_t* HWY_RESTRICT blk, const ActRow* A, size_t b,
                               TOWERS_V8(s), TOWERS_V8(m)) {
  static_assert(std::is_same_v<V32, V512>, "one 16-row slice per vector");
  const size_t e = b * (is_k(kType) ? 256 : 32);
#define TOWERS_X8(i) const int8_t* HWY_RESTRICT x##i = A[i].q8 + e; (void)x##i;
  TOWERS_ALL8(TOWERS_X8)
#undef TOWERS_X8
  const auto z = hn::Zero(d32);
  s0 = z, s1 = z, s2 = z, s3 = z, s4 = z, s5 = z, s6 = z, s7 = z;
  m0 = z, m1 = z, m2 = z, m3 = z, m4 = z, m5 = z, m6 = z, m7 = z;
  const __m512i k0F = _mm512_set1_epi8(0x0F);
  if constexpr (R == 1 && (kType == kQ8_0 || kType == kQ4_0)) {
    // Decode: one row of activations would make each block one chain of 8 dependent vpdpbusd
    // (latency-bound at ~1/4 of their throughput). Four independent int32 sums instead; integer
    // addition is exact, so s0 is the same integer as below and on the other targets.
    const uint8_t* HWY_RESTRICT qs = blk + 2 * kPackRows;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    if constexpr (kType == kQ8_0) {
      const __m512i k80 = _mm512_set1_epi8(static_cast<char>(0x80));
      for (size_t p = 0; p < 16; p += 8) {
        a0 = _mm512_dpbusd_epi32(a0, _mm512_xor_si512(PairChunks(qs + 32 * p), k80), Bcast4(x0 + 2 * p));
        a1 = _mm512_dpbusd_epi32(a1, _mm512_xor_si512(PairChunks(qs + 32 * p + 64), k80), Bcast4(x0 + 2 * p + 4));
        a2 = _mm512_dpbusd_epi32(a2, _mm512_xor_si512(PairChunks(qs + 32 * p + 128), k80), Bcast4(x0 + 2 * p + 8));
        a3 = _mm512_dpbusd_epi32(a3, _mm512_xor_si512(PairChunks(qs + 32 * p + 192), k80), Bcast4(x0 + 2 * p + 12));
      }
    } else {
      static_assert(kType == kQ4_0);
      for (size_t p = 0; p < 8; p += 4) {
        const __m512i v = PairChunks(qs + 32 * p), u = PairChunks(qs + 32 * p + 64);
        a0 = _mm512_dpbusd_epi32(a0, _mm512_and_si512(v, k0F), Bcast4(x0 + 2 * p));
        a1 = _mm512_dpbusd_epi32(a1, _mm512_and_si512(_mm512_srli_epi16(v, 4), k0F), Bcast4(x0 + 16 + 2 * p));
        a2 = _mm512_dpbusd_epi32(a2, _mm512_and_si512(u, k0F), Bcast4(x0 + 2 * p + 4));
        a3 = _mm512_dpbusd_epi32(a3, _mm512_and_si512(_mm512_srli_epi16(u, 4), k0F), Bcast4(x0 + 16 + 2 * p + 4));
      }
    }
    const int32_t offset = (kType == kQ8_0 ? 128 : 8) * A[0].s[b];
    s0 = hn::Sub(V512{_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3))}, hn::Set(d32, offset));
  } else if constexpr (kType == kQ8_0) {
    const uint8_t* HWY_RESTRICT qs = blk + 2 * kPackRows;
    const __m512i k80 = _mm512_set1_epi8(static_cast<char>(0x80));
    for (size_t p = 0; p < 16; p += 2) {
      const __m512i w = _mm512_xor_si512(PairChunks(qs + 32 * p), k80);  // q + 128 as u8
#define TOWERS_MAC(i) s##i = Dp(s##i, w, x##i + 2 * p);
      TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
    }
    // sum (q + 128) * x - 128 * sum x (exact).
#define TOWERS_FIN(i) s##i = hn::Sub(s##i, hn::Set(d32, 128 * A[i].s[b]));
    TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
  } else if constexpr (kType == kQ4_0) {
    const uint8_t* HWY_RESTRICT qs = blk + 2 * kPackRows;
    for (size_t p = 0; p < 8; p += 2) {
      const __m512i v = PairChunks(qs + 32 * p);
      const __m512i lo = _mm512_and_si512(v, k0F);                         // elements 2p..2p+3
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), k0F);  // elements 16+2p..
#define TOWERS_MAC(i) s##i = Dp(Dp(s##i, lo, x##i + 2 * p), hi, x##i + 16 + 2 * p);
      TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
    }
#define TOWERS_FIN(i) s##i = hn::Sub(s##i, hn::Set(d32, 8 * A[i].s[b]));
    TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
  } else if constexpr (kType == kQ6_K) {
    // Per 16-element scale group g: the 6-bit codes (0..63) are the unsigned operand; the exact sum
    // of code * x, minus 32 * the group's activation sum (A256 bs16), is sum (q - 32) * x, times the
    // row's int8 scale (int32), as in PackedSums. Chunks 2c and 2c+1 of the low 4 bits come from one
    // PairChunks; their top 2 bits are both in qh chunk c: each row's qh word is duplicated into its
    // lane and shifted per word (0 and 4 for the low-nibble elements, 2 and 6 for the high ones).
    const hn::Rebind<int8_t, D32> di8x32;
    const int8_t* HWY_RESTRICT scb = reinterpret_cast<const int8_t*>(blk + 2 * kPackRows);
    const uint8_t* HWY_RESTRICT q = blk + 2 * kPackRows + 16 * kPackRows;
    const __m512i k03 = _mm512_set1_epi8(3);
    const __m512i dup = _mm512_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8, 7, 7, 6, 6,
                                         5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i shift_lo = _mm512_set1_epi32(0x00040000), shift_hi = _mm512_set1_epi32(0x00060002);
    for (size_t g = 0; g < 16; ++g) {
      const uint8_t* HWY_RESTRICT ql = q + g * 192;
      const uint8_t* HWY_RESTRICT qh = ql + 128;
      TOWERS_ZERO8(l, z)
      for (size_t c = 0; c < 2; ++c) {
        const __m512i L = PairChunks(ql + 64 * c);
        const __m512i H = _mm512_permutexvar_epi16(
            dup, _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * c))));
        const __m512i lo = _mm512_or_si512(
            _mm512_and_si512(L, k0F), _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(H, shift_lo), k03), 4));
        const __m512i hi =
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 4), k0F),
                            _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(H, shift_hi), k03), 4));
        const size_t eg = e + 16 * g + 4 * c;
#define TOWERS_MAC(i) l##i = Dp(Dp(l##i, lo, A[i].q8 + eg), hi, A[i].q8 + eg + 8);
        TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
      }
      const auto scv = hn::PromoteTo(d32, hn::LoadU(di8x32, scb + 16 * g));
#define TOWERS_SC(i) s##i = hn::Add(s##i, hn::Mul(hn::Sub(l##i, hn::Set(d32, 32 * A[i].bs16[16 * b + g])), scv));
      TOWERS_EACH_P(TOWERS_SC)
#undef TOWERS_SC
    }
  } else {
    static_assert(kType == kQ4_K);
    const hn::Rebind<uint8_t, D32> du8x32;
    const uint8_t* HWY_RESTRICT sc = blk + kQ4KScales;
    const uint8_t* HWY_RESTRICT q = blk + kQ4KQuants;
    // Up to 2 tokens: both sub-blocks of a part from one load of each chunk pair.
    if constexpr (R <= 2) for (size_t c = 0; c < 4; ++c) {
      TOWERS_ZERO8(l, z)
      TOWERS_ZERO8(h, z)
      const uint8_t* HWY_RESTRICT qc = q + 512 * c;
      const size_t ec = 64 * c;
      for (size_t p = 0; p < 16; p += 2) {
        const __m512i v = PairChunks(qc + 32 * p);
        const __m512i wl = _mm512_and_si512(v, k0F), wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), k0F);
#define TOWERS_MAC(i) l##i = Dp(l##i, wl, x##i + ec + 2 * p); h##i = Dp(h##i, wh, x##i + ec + 32 + 2 * p);
        TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
      }
      const auto scl = hn::PromoteTo(d32, hn::LoadU(du8x32, sc + 32 * c));
      const auto sch = hn::PromoteTo(d32, hn::LoadU(du8x32, sc + 32 * c + 16));
#define TOWERS_SC(i) s##i = hn::Add(s##i, hn::Add(hn::Mul(l##i, scl), hn::Mul(h##i, sch)));
      TOWERS_EACH_P(TOWERS_SC)
#undef TOWERS_SC
    }
    // Sub-block j = 2c + half: the low (half 0) or high (half 1) nibbles of part c. One sub-block at
    // a time keeps 8 accumulators live besides the 8 sums (the weights are loaded twice).
    if constexpr (R > 2) for (size_t j = 0; j < 8; ++j) {
      const size_t c = j / 2, half = j % 2;
      TOWERS_ZERO8(l, z)
      const uint8_t* HWY_RESTRICT qc = q + 512 * c;
      const size_t ej = 64 * c + 32 * half;
      for (size_t p = 0; p < 16; p += 2) {
        const __m512i v = PairChunks(qc + 32 * p);
        const __m512i w = _mm512_and_si512(half ? _mm512_srli_epi16(v, 4) : v, k0F);
#define TOWERS_MAC(i) l##i = Dp(l##i, w, x##i + ej + 2 * p);
        TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
      }
      const auto scj = hn::PromoteTo(d32, hn::LoadU(du8x32, sc + 16 * j));
#define TOWERS_SC(i) s##i = hn::Add(s##i, hn::Mul(l##i, scj));
      TOWERS_EACH_P(TOWERS_SC)
#undef TOWERS_SC
    }
    // Min term as in PackedSums (int16 madd of the mins with the 32-element sums).
    const hn::Repartition<int16_t, D32> d16;
    const hn::RebindToUnsigned<decltype(d16)> du16;
    const hn::Rebind<uint8_t, decltype(d16)> du8;
    const uint8_t* HWY_RESTRICT mn = blk + kQ4KMins;
    TOWERS_ZERO8(u, z)
    for (size_t k = 0; k < 4; ++k) {
      const auto mv = hn::BitCast(d16, hn::PromoteTo(du16, hn::LoadU(du8, mn + 32 * k)));
#define TOWERS_MIN(i) m##i = hn::ReorderWidenMulAccumulate(d32, mv, PairAt(d16, A[i].bs + 8 * b + 2 * k), m##i, u##i);
      TOWERS_EACH_P(TOWERS_MIN)
#undef TOWERS_MIN
    }
#define TOWERS_FIN(i) m##i = hn::RearrangeToOddPlusEven(m##i, u##i);
    TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
  }
}
#else
template <uint32_t kType>
constexpr bool kVnni = false;
#endif  // HWY_TARGET == HWY_AVX3_DL

// Exact int32 sums of one slice (rows sl.., one int32 lane each) of packed block b with up to 8
// activation rows: s_i for the d_w term, m_i for Q4_K's min term (zero for the other types).
template <uint32_t kType, size_t R, class D32, class V32>
HWY_INLINE void PackedSums(D32 d32, const uint8_t* HWY_RESTRICT blk, size_t sl, const ActRow* A,
                           size_t b, TOWERS_V8(s), TOWERS_V8(m)) {
  const hn::Repartition<int16_t, D32> d16;
  const hn::RebindToUnsigned<decltype(d16)> du16;
  const hn::Rebind<uint8_t, decltype(d16)> du8;
  const auto k15 = hn::Set(du16, uint16_t{15});
  const size_t e = b * (is_k(kType) ? 256 : 32);
  TOWERS_ALL8(TOWERS_ACT_AT)
  const auto z = hn::Zero(d32);
  s0 = z, s1 = z, s2 = z, s3 = z, s4 = z, s5 = z, s6 = z, s7 = z;
  m0 = z, m1 = z, m2 = z, m3 = z, m4 = z, m5 = z, m6 = z, m7 = z;
  TOWERS_ZERO8(u, z)
  if constexpr (kType == kQ8_0) {
    const hn::Rebind<int8_t, decltype(d16)> di8;
    const int8_t* HWY_RESTRICT qs = reinterpret_cast<const int8_t*>(blk + 2 * kPackRows) + 2 * sl;
    for (size_t p = 0; p < 16; ++p) {
      const auto w = hn::PromoteTo(d16, hn::LoadU(di8, qs + 32 * p));
#define TOWERS_MAC(i) s##i = hn::ReorderWidenMulAccumulate(d32, w, PairAt(d16, aq##i + 2 * p), s##i, u##i);
      TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
    }
#define TOWERS_FIN(i) s##i = hn::RearrangeToOddPlusEven(s##i, u##i);
    TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
  } else if constexpr (kType == kQ4_0) {
    const uint8_t* HWY_RESTRICT qs = blk + 2 * kPackRows + 2 * sl;
    for (size_t p = 0; p < 8; ++p) {
      const auto bytes = hn::PromoteTo(du16, hn::LoadU(du8, qs + 32 * p));
      const auto lo = hn::BitCast(d16, hn::And(bytes, k15));       // elements 2p, 2p+1
      const auto hi = hn::BitCast(d16, hn::ShiftRight<4>(bytes));  // elements 2p+16, 2p+17
#define TOWERS_MAC(i)                                                                    \
  s##i = hn::ReorderWidenMulAccumulate(d32, lo, PairAt(d16, aq##i + 2 * p), s##i, u##i); \
  s##i = hn::ReorderWidenMulAccumulate(d32, hi, PairAt(d16, aq##i + 16 + 2 * p), s##i, u##i);
      TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
    }
    // sum (q - 8) * x = sum q * x - 8 * sum x, exactly in int32.
#define TOWERS_FIN(i) s##i = hn::Sub(hn::RearrangeToOddPlusEven(s##i, u##i), hn::Set(d32, 8 * A[i].s[b]));
    TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
  } else if constexpr (kType == kQ6_K) {
    // Per 16-element scale group: int32 sums of (q - 32) * x, times the row's int8 scale.
    const hn::Rebind<int8_t, D32> di8x32;
    const auto k48 = hn::Set(du16, uint16_t{48});
    const auto k32 = hn::Set(du16, uint16_t{32});
    const int8_t* HWY_RESTRICT sc = reinterpret_cast<const int8_t*>(blk + 2 * kPackRows) + sl;
    const uint8_t* HWY_RESTRICT q = blk + 2 * kPackRows + 16 * kPackRows + 2 * sl;
    for (size_t g = 0; g < 16; ++g) {
      const uint8_t* HWY_RESTRICT ql = q + g * 192;
      const uint8_t* HWY_RESTRICT qh = ql + 128;
      TOWERS_ZERO8(g, z)
      TOWERS_ZERO8(gu, z)
      const size_t eg = 16 * g;
      for (size_t ph = 0; ph < 2; ++ph) {
        const auto H = hn::PromoteTo(du16, hn::LoadU(du8, qh + 32 * ph));
        for (size_t pl = 0; pl < 2; ++pl) {
          const size_t p = 2 * ph + pl;
          const auto L = hn::PromoteTo(du16, hn::LoadU(du8, ql + 32 * p));
          const auto Hs = pl ? hn::ShiftRight<4>(H) : H;
          const auto lo = hn::BitCast(
              d16, hn::Sub(hn::Or(hn::And(L, k15), hn::And(hn::ShiftLeft<4>(Hs), k48)), k32));
          const auto hi = hn::BitCast(
              d16, hn::Sub(hn::Or(hn::ShiftRight<4>(L), hn::And(hn::ShiftLeft<2>(Hs), k48)), k32));
#define TOWERS_MAC(i)                                                                           \
  g##i = hn::ReorderWidenMulAccumulate(d32, lo, PairAt(d16, aq##i + eg + 2 * p), g##i, gu##i); \
  g##i = hn::ReorderWidenMulAccumulate(d32, hi, PairAt(d16, aq##i + eg + 8 + 2 * p), g##i, gu##i);
          TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
        }
      }
      const auto scv = hn::PromoteTo(d32, hn::LoadU(di8x32, sc + 16 * g));
#define TOWERS_SC(i) s##i = hn::Add(s##i, hn::Mul(hn::RearrangeToOddPlusEven(g##i, gu##i), scv));
      TOWERS_EACH_P(TOWERS_SC)
#undef TOWERS_SC
    }
  } else {
    static_assert(kType == kQ4_K);
    // Per 32-element sub-block j: int32 sums of q * x (q in 0..15), times the row's 6-bit scale
    // (|sum| <= 15 * 127 * 32, times 63, times 8 sub-blocks < 2^31). Chunk p of part c holds
    // sub-block 2c's elements 2p, 2p+1 (low nibbles) and sub-block 2c+1's (high nibbles).
    const hn::Rebind<uint8_t, D32> du8x32;
    const uint8_t* HWY_RESTRICT sc = blk + kQ4KScales + sl;
    const uint8_t* HWY_RESTRICT q = blk + kQ4KQuants + 2 * sl;
    // Up to 4 tokens: both sub-blocks of a part at once (each chunk unpacked once).
    if constexpr (R <= 4) for (size_t c = 0; c < 4; ++c) {
      TOWERS_ZERO8(l, z)
      TOWERS_ZERO8(h, z)
      TOWERS_ZERO8(lu, z)
      TOWERS_ZERO8(hu, z)
      const uint8_t* HWY_RESTRICT qc = q + 512 * c;
      const size_t ec = 64 * c;
      for (size_t p = 0; p < 16; ++p) {
        const auto bytes = hn::PromoteTo(du16, hn::LoadU(du8, qc + 32 * p));
        const auto lo = hn::BitCast(d16, hn::And(bytes, k15));
        const auto hi = hn::BitCast(d16, hn::ShiftRight<4>(bytes));
#define TOWERS_MAC(i)                                                                               \
  l##i = hn::ReorderWidenMulAccumulate(d32, lo, PairAt(d16, aq##i + ec + 2 * p), l##i, lu##i);      \
  h##i = hn::ReorderWidenMulAccumulate(d32, hi, PairAt(d16, aq##i + ec + 32 + 2 * p), h##i, hu##i);
        TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
      }
      const auto scl = hn::PromoteTo(d32, hn::LoadU(du8x32, sc + 32 * c));
      const auto sch = hn::PromoteTo(d32, hn::LoadU(du8x32, sc + 32 * c + 16));
#define TOWERS_SC(i)                                                                  \
  s##i = hn::Add(s##i, hn::Add(hn::Mul(hn::RearrangeToOddPlusEven(l##i, lu##i), scl), \
                               hn::Mul(hn::RearrangeToOddPlusEven(h##i, hu##i), sch)));
      TOWERS_EACH_P(TOWERS_SC)
#undef TOWERS_SC
    }
    // 5 to 8 tokens: one sub-block j = 2c + half at a time (the low or high nibbles of part c's
    // chunks), so fewer accumulators are live (no spills); the chunks are unpacked once per half.
    if constexpr (R > 4) for (size_t j = 0; j < 8; ++j) {
      const size_t c = j / 2, half = j % 2;
      TOWERS_ZERO8(l, z)
      TOWERS_ZERO8(lu, z)
      const uint8_t* HWY_RESTRICT qc = q + 512 * c;
      const size_t ej = 64 * c + 32 * half;
      for (size_t p = 0; p < 16; ++p) {
        const auto bytes = hn::PromoteTo(du16, hn::LoadU(du8, qc + 32 * p));
        const auto w = hn::BitCast(d16, half ? hn::ShiftRight<4>(bytes) : hn::And(bytes, k15));
#define TOWERS_MAC(i) l##i = hn::ReorderWidenMulAccumulate(d32, w, PairAt(d16, aq##i + ej + 2 * p), l##i, lu##i);
        TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
      }
      const auto scj = hn::PromoteTo(d32, hn::LoadU(du8x32, sc + 16 * j));
#define TOWERS_SC(i) s##i = hn::Add(s##i, hn::Mul(hn::RearrangeToOddPlusEven(l##i, lu##i), scj));
      TOWERS_EACH_P(TOWERS_SC)
#undef TOWERS_SC
    }
    // Min term: sum_j min_j * bsum_j (the activation's 32-element sums), mins stored as pairs.
    const uint8_t* HWY_RESTRICT mn = blk + kQ4KMins + 2 * sl;
    for (size_t k = 0; k < 4; ++k) {
      const auto mv = hn::BitCast(d16, hn::PromoteTo(du16, hn::LoadU(du8, mn + 32 * k)));
#define TOWERS_MIN(i) m##i = hn::ReorderWidenMulAccumulate(d32, mv, PairAt(d16, A[i].bs + 8 * b + 2 * k), m##i, u##i);
      TOWERS_EACH_P(TOWERS_MIN)
#undef TOWERS_MIN
    }
#define TOWERS_FIN(i) m##i = hn::RearrangeToOddPlusEven(m##i, u##i);
    TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
  }
}
#undef TOWERS_ACT_AT

constexpr size_t kPrefetchBytes = 4096;  // how far ahead PackedGroup prefetches weights (decode)

// acc (one slice of a token's 16 rows) += (s as f32) * (dw * dx): the only f32 rounding steps.
template <class DF, class V32>
HWY_INLINE void AccumulateSlice(DF df, float* HWY_RESTRICT acc, V32 s, hn::Vec<DF> dw, float dx) {
  hn::Store(hn::MulAdd(hn::ConvertTo(df, s), hn::Mul(dw, hn::Set(df, dx)), hn::Load(df, acc)), df, acc);
}

template <uint32_t kType, size_t R>
HWY_NOINLINE void PackedGroup(const uint8_t* HWY_RESTRICT grp, const ActRow* A, size_t nb,
                              float* HWY_RESTRICT y, size_t ldy) {
  const hn::CappedTag<int32_t, kPackRows> d32;
  const hn::Rebind<float, decltype(d32)> df;
  const hn::Rebind<hwy::float16_t, decltype(d32)> dh;
  const size_t NR = hn::Lanes(d32);  // rows per slice
  using V32 = hn::Vec<decltype(d32)>;
  constexpr size_t kGB = kPackRows * packed_block_bytes(kType);
  // Exact int32 sums of slice sl of block b (blk) for every token (the target's best kernel).
  auto block_sums = [&](const uint8_t* HWY_RESTRICT blk, size_t sl, size_t b, TOWERS_V8(s), TOWERS_V8(m)) {
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = hn::Zero(d32);
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = s0;
#if HWY_TARGET == HWY_AVX3_DL
    if constexpr (kVnni<kType>) {
      PackedSumsVnni<kType, R>(d32, blk, A, b, s0, s1, s2, s3, s4, s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7);
      return;
    }
#endif
    PackedSums<kType, R>(d32, blk, sl, A, b, s0, s1, s2, s3, s4, s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7);
  };
  // Decode streams each weight byte once: ask for the bytes 4 KiB ahead (past the group's end, the
  // next group's). Measured with 1 GB of packed Q4_0 (2 threads, 6 interleaved pairs): +6% at 2
  // threads, +25% at 1; 1 KiB, 8 KiB and 16 KiB ahead were worse. Prefill is compute-bound (R > 2)
  // and skips it. A prefetch never faults, even past the buffer.
  auto prefetch = [](const uint8_t* blk) {
    if constexpr (R <= 2) {
      for (size_t o = 0; o < kGB; o += 64) hwy::Prefetch(blk + kPrefetchBytes + o);
    }
  };
  if (R <= 2 && NR == kPackRows) {
    // Decode, and one slice holds all 16 rows (AVX-512): the accumulators stay in registers.
    // (Through memory, each block's multiply-add waited on the previous block's store: a dependency
    // chain per block. With more tokens the extra registers made the kernels spill.) The operations
    // are those of AccumulateSlice, in the same order: the same bits.
    auto a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (size_t b = 0; b < nb; ++b) {
      const uint8_t* HWY_RESTRICT blk = grp + b * kGB;
      prefetch(blk);
      const auto* HWY_RESTRICT f16 = reinterpret_cast<const hwy::float16_t*>(blk);
      V32 s0, s1, s2, s3, s4, s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7;
      block_sums(blk, 0, b, s0, s1, s2, s3, s4, s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7);
      const auto dw = hn::PromoteTo(df, hn::LoadU(dh, f16));
#define TOWERS_ACC(i) a##i = hn::MulAdd(hn::ConvertTo(df, s##i), hn::Mul(dw, hn::Set(df, A[i].d[b])), a##i);
      TOWERS_EACH_P(TOWERS_ACC)
#undef TOWERS_ACC
      if constexpr (kType == kQ4_K) {
        const auto ndmin = hn::Neg(hn::PromoteTo(df, hn::LoadU(dh, f16 + kPackRows)));
#define TOWERS_ACC(i) a##i = hn::MulAdd(hn::ConvertTo(df, m##i), hn::Mul(ndmin, hn::Set(df, A[i].d[b])), a##i);
        TOWERS_EACH_P(TOWERS_ACC)
#undef TOWERS_ACC
      }
    }
#define TOWERS_OUT(i) hn::StoreU(a##i, df, y + (i) * ldy);
    TOWERS_EACH_P(TOWERS_OUT)
#undef TOWERS_OUT
    return;
  }
  HWY_ALIGN float acc[kMaxPackR * kPackRows];
  for (size_t i = 0; i < R * kPackRows; ++i) acc[i] = 0.f;
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* HWY_RESTRICT blk = grp + b * kGB;
    prefetch(blk);
    const auto* HWY_RESTRICT f16 = reinterpret_cast<const hwy::float16_t*>(blk);
    for (size_t sl = 0; sl < kPackRows; sl += NR) {
      V32 s0, s1, s2, s3, s4, s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7;
      block_sums(blk, sl, b, s0, s1, s2, s3, s4, s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7);
      const auto dw = hn::PromoteTo(df, hn::LoadU(dh, f16 + sl));
#define TOWERS_ACC(i) AccumulateSlice(df, acc + (i) * kPackRows + sl, s##i, dw, A[i].d[b]);
      TOWERS_EACH_P(TOWERS_ACC)
#undef TOWERS_ACC
      if constexpr (kType == kQ4_K) {
        const auto ndmin = hn::Neg(hn::PromoteTo(df, hn::LoadU(dh, f16 + kPackRows + sl)));
#define TOWERS_ACC(i) AccumulateSlice(df, acc + (i) * kPackRows + sl, m##i, ndmin, A[i].d[b]);
        TOWERS_EACH_P(TOWERS_ACC)
#undef TOWERS_ACC
      }
    }
  }
  for (size_t i = 0; i < R; ++i) std::memcpy(y + i * ldy, acc + i * kPackRows, kPackRows * sizeof(float));
}
#undef TOWERS_V8
#undef TOWERS_ZERO8
#undef TOWERS_ALL8
#undef TOWERS_EACH_P
#endif  // HWY_TARGET == HWY_SCALAR

#if HWY_TARGET == HWY_SCALAR
constexpr size_t kPackR = 4;
template <uint32_t kType>
constexpr bool kVnni = false;
#endif

template <uint32_t kType>
void GemmPackedType(const uint8_t* packed, size_t groups, const uint8_t* act, size_t act_stride,
                    size_t T, size_t n, float* y, size_t ldy) {
  const size_t nb = n / (is_k(kType) ? 256 : 32);
  const size_t gbytes = nb * kPackRows * packed_block_bytes(kType);
  // Token tiles whose activations stay in L2 while the groups stream past them (order only).
  constexpr size_t kActBudget = 256 * 1024;
  // Q6_K's madd kernel spills with 8 tokens (its 6-bit unpacking needs more registers): 4.
  constexpr size_t kR = kType == kQ6_K && !kVnni<kType> ? std::min<size_t>(kPackR, 4) : kPackR;
  constexpr size_t kMaxSteps = 32;  // token steps per tile (bounds the tile's ActRow table)
  const size_t tb = std::min(kMaxSteps * kR, std::max<size_t>(kR, (kActBudget / act_stride) / kR * kR));
  // The activation rows of one token tile, kR at a time (built once per tile, not once per group).
  std::array<ActRow, kMaxPackR> tiles[kMaxSteps];
  for (size_t t0 = 0; t0 < T; t0 += tb) {
    const size_t t1 = std::min(T, t0 + tb);
    for (size_t t = t0; t < t1; t += kR) {
      const size_t cnt = std::min(kR, t1 - t);
      for (size_t i = 0; i < kMaxPackR; ++i) {
        tiles[(t - t0) / kR][i] = act_row(kType, act + (t + (i < cnt ? i : 0)) * act_stride, n);
      }
    }
    for (size_t g = 0; g < groups; ++g) {
      const uint8_t* grp = packed + g * gbytes;
      for (size_t t = t0; t < t1; t += kR) {
        const size_t cnt = std::min(kR, t1 - t);
        const ActRow* A = tiles[(t - t0) / kR].data();
        float* yo = y + t * ldy + g * kPackRows;
        switch (cnt) {
          case 8: PackedGroup<kType, kR == 8 ? 8 : 1>(grp, A, nb, yo, ldy); break;
          case 7: PackedGroup<kType, kR == 8 ? 7 : 1>(grp, A, nb, yo, ldy); break;
          case 6: PackedGroup<kType, kR == 8 ? 6 : 1>(grp, A, nb, yo, ldy); break;
          case 5: PackedGroup<kType, kR == 8 ? 5 : 1>(grp, A, nb, yo, ldy); break;
          case 4: PackedGroup<kType, 4>(grp, A, nb, yo, ldy); break;
          case 3: PackedGroup<kType, 3>(grp, A, nb, yo, ldy); break;
          case 2: PackedGroup<kType, 2>(grp, A, nb, yo, ldy); break;
          default: PackedGroup<kType, 1>(grp, A, nb, yo, ldy); break;
        }
      }
    }
  }
}

void GemmPacked(uint32_t type, const void* packed, size_t groups, const void* act, size_t act_stride,
                size_t T, size_t n, float* y, size_t ldy) {
  const auto* pb = static_cast<const uint8_t*>(packed);
  const auto* ab = static_cast<const uint8_t*>(act);
  switch (type) {
    case kQ4_0: return GemmPackedType<kQ4_0>(pb, groups, ab, act_stride, T, n, y, ldy);
    case kQ8_0: return GemmPackedType<kQ8_0>(pb, groups, ab, act_stride, T, n, y, ldy);
    case kQ4_K: return GemmPackedType<kQ4_K>(pb, groups, ab, act_stride, T, n, y, ldy);
    case kQ6_K: return GemmPackedType<kQ6_K>(pb, groups, ab, act_stride, T, n, y, ldy);
    default: return;
  }
}

#undef TOWERS_ACT_PTRS
#undef TOWERS_EACH_R

const char* QuantDotTarget() { return hwy::TargetName(HWY_TARGET); }

// ---------------------------------------------------------------------------------------------
// Activation quantization: per block d = amax/127, q = nearest_even(x * 127/amax).
void QuantizeAct(uint32_t type, const float* HWY_RESTRICT x, void* act, size_t n) {
  const size_t B = is_k(type) ? 256 : 32;
  const size_t nb = n / B;
  auto* p = static_cast<uint8_t*>(act);
  int16_t* HWY_RESTRICT q = reinterpret_cast<int16_t*>(p);
  float* HWY_RESTRICT d = reinterpret_cast<float*>(p + 2 * n);
  float* HWY_RESTRICT ds = d + nb;                                           // A32
  int32_t* HWY_RESTRICT si = reinterpret_cast<int32_t*>(ds + nb);             // A32
  int16_t* HWY_RESTRICT bs = reinterpret_cast<int16_t*>(p + 2 * n + 4 * nb);  // A256
  int8_t* HWY_RESTRICT q8 = reinterpret_cast<int8_t*>(p + 2 * n + (B == 32 ? 12 : 20) * nb);
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
    d[b] = db;
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
        ds[b] = db * static_cast<float>(sum);
        si[b] = sum;
      } else {
        bs[b * 8 + g / 32] = static_cast<int16_t>(sum);
      }
    }
    if (B == 256) {  // the 16-element sums (exact; |sum| <= 16 * 127)
      int16_t* HWY_RESTRICT bs16 = reinterpret_cast<int16_t*>(p + 3 * n + 20 * nb) + b * 16;
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
HWY_EXPORT(GemmQ);
HWY_EXPORT(QuantizeAct);
HWY_EXPORT(GemmPacked);
HWY_EXPORT(QuantDotTarget);

const char* quant_dot_target() { return HWY_DYNAMIC_DISPATCH(QuantDotTarget)(); }

bool has_quant_dot(uint32_t t) { return qd::block_bytes(t) != 0; }

size_t act_bytes(uint32_t t, size_t n) {
  if (!has_quant_dot(t)) return 0;
  if (qd::is_k(t)) return 3 * n + (4 + 16 + 32) * (n / 256);
  return 3 * n + 12 * (n / 32);
}

void quantize_act(uint32_t t, const float* x, void* act, size_t n) {
  if (!has_quant_dot(t)) return;
  HWY_DYNAMIC_DISPATCH(QuantizeAct)(t, x, act, n);
}

void gemm_q(uint32_t t, const void* w, size_t row_stride, size_t rows, const void* act,
            size_t act_stride, size_t T, size_t n, float* y, size_t ldy) {
  if (!has_quant_dot(t) || rows == 0 || T == 0) return;
  HWY_DYNAMIC_DISPATCH(GemmQ)(t, w, row_stride, rows, act, act_stride, T, n, y, ldy);
}
bool has_packed(uint32_t t) { return t == qd::kQ4_0 || t == qd::kQ8_0 || t == qd::kQ4_K || t == qd::kQ6_K; }

size_t packed_group_bytes(uint32_t t, size_t n) {
  return has_packed(t) ? kPackRows * qd::packed_block_bytes(t) * (n / (qd::is_k(t) ? 256 : 32)) : 0;
}

namespace {
// Element e (0..255) of a ggml Q6_K block as its unsigned 6-bit code (ggml's dequantize_row_q6_K).
int q6k_code(const uint8_t* blk, size_t e) {
  const size_t h = e / 128, l = e % 128, quarter = l / 32, ll = l % 32;
  const uint8_t L = blk[64 * h + ll + 32 * (quarter & 1)];
  const int lo4 = quarter >= 2 ? L >> 4 : L & 15;
  const int hi2 = (blk[128 + 32 * h + ll] >> (2 * quarter)) & 3;
  return lo4 | hi2 << 4;
}

void pack_q6k(const uint8_t* src, size_t row_stride, size_t groups, size_t n, uint8_t* dst) {
  const size_t nb = n / 256, bb = qd::block_bytes(qd::kQ6_K);
  for (size_t g = 0; g < groups; ++g) {
    for (size_t b = 0; b < nb; ++b) {
      uint8_t* o = dst + (g * nb + b) * kPackRows * bb;
      for (size_t r = 0; r < kPackRows; ++r) {
        const uint8_t* blk = src + (g * kPackRows + r) * row_stride + b * bb;
        std::memcpy(o + 2 * r, blk + 208, 2);                                       // d
        for (size_t sg = 0; sg < 16; ++sg) o[2 * kPackRows + 16 * sg + r] = blk[192 + sg];  // scales
        for (size_t sg = 0; sg < 16; ++sg) {
          uint8_t* ql = o + 2 * kPackRows + 16 * kPackRows + sg * 192;
          uint8_t* qh = ql + 128;
          for (size_t p = 0; p < 4; ++p) {
            for (size_t k = 0; k < 2; ++k) {
              const int lo = q6k_code(blk, 16 * sg + 2 * p + k), hi = q6k_code(blk, 16 * sg + 8 + 2 * p + k);
              ql[32 * p + 2 * r + k] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
              uint8_t& h = qh[32 * (p / 2) + 2 * r + k];
              if (p % 2 == 0) h = 0;
              h |= static_cast<uint8_t>(((lo >> 4) | (hi >> 4) << 2) << (4 * (p % 2)));
            }
          }
        }
      }
    }
  }
}

void pack_q4k(const uint8_t* src, size_t row_stride, size_t groups, size_t n, uint8_t* dst) {
  const size_t nb = n / 256, bb = qd::block_bytes(qd::kQ4_K), pb = qd::packed_block_bytes(qd::kQ4_K);
  for (size_t g = 0; g < groups; ++g) {
    for (size_t b = 0; b < nb; ++b) {
      uint8_t* o = dst + (g * nb + b) * kPackRows * pb;
      for (size_t r = 0; r < kPackRows; ++r) {
        const uint8_t* blk = src + (g * kPackRows + r) * row_stride + b * bb;
        std::memcpy(o + 2 * r, blk, 2);                  // d
        std::memcpy(o + qd::kQ4KDmin + 2 * r, blk + 2, 2);  // dmin
        uint8_t sc[8], mn[8];
        qd::ScaleMinK4(blk + 4, sc, mn);
        for (size_t j = 0; j < 8; ++j) {
          o[qd::kQ4KScales + kPackRows * j + r] = sc[j];
          o[qd::kQ4KMins + 2 * kPackRows * (j / 2) + 2 * r + j % 2] = mn[j];
        }
        for (size_t c = 0; c < 4; ++c) {
          for (size_t p = 0; p < 16; ++p) {
            std::memcpy(o + qd::kQ4KQuants + 512 * c + 32 * p + 2 * r, blk + 16 + 32 * c + 2 * p, 2);
          }
        }
      }
    }
  }
}
}  // namespace

void pack_rows(uint32_t t, const void* w, size_t row_stride, size_t groups, size_t n, void* out) {
  if (!has_packed(t)) return;
  if (t == qd::kQ6_K) {
    return pack_q6k(static_cast<const uint8_t*>(w), row_stride, groups, n, static_cast<uint8_t*>(out));
  }
  if (t == qd::kQ4_K) {
    return pack_q4k(static_cast<const uint8_t*>(w), row_stride, groups, n, static_cast<uint8_t*>(out));
  }
  const size_t bb = qd::block_bytes(t), nb = n / 32, chunks = (bb - 2) / 2;
  const auto* src = static_cast<const uint8_t*>(w);
  auto* dst = static_cast<uint8_t*>(out);
  for (size_t g = 0; g < groups; ++g) {
    for (size_t b = 0; b < nb; ++b) {
      uint8_t* o = dst + (g * nb + b) * kPackRows * bb;
      for (size_t r = 0; r < kPackRows; ++r) {
        const uint8_t* blk = src + (g * kPackRows + r) * row_stride + b * bb;
        std::memcpy(o + 2 * r, blk, 2);
        for (size_t p = 0; p < chunks; ++p) {
          std::memcpy(o + 2 * kPackRows + 32 * p + 2 * r, blk + 2 + 2 * p, 2);
        }
      }
    }
  }
}

void gemm_packed(uint32_t t, const void* packed, size_t groups, const void* act, size_t act_stride,
                 size_t T, size_t n, float* y, size_t ldy) {
  if (!has_packed(t) || groups == 0 || T == 0) return;
  HWY_DYNAMIC_DISPATCH(GemmPacked)(t, packed, groups, act, act_stride, T, n, y, ldy);
}
}  // namespace towers::simd
#endif
