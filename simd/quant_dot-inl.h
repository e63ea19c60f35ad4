// Per-target helpers shared by the quantized-dot kernels (gemm_q.cc, gemm_packed.cc and
// gemm_packed_vnni-inl.h): f16 loads, int16 scale pairs and activation pairs broadcast to all lanes,
// the IQ4 codebook lookup, the packed Q2_K/Q3_K scale step and Q4_K min term, and the expansion of one
// statement per activation row. Included once per Highway target.

// The row expansions are plain macros (defined once for all targets).
#ifndef TOWERS_SIMD_QUANT_DOT_ROWS
#define TOWERS_SIMD_QUANT_DOT_ROWS
// Expands X(i) for every activation row i < R of the current kernel (R is a template parameter).
// Named variables rather than arrays: SVE vectors cannot live in arrays or structs.
#define TOWERS_EACH_R(X) \
  X(0)                   \
  if constexpr (R > 1) { \
    X(1)                 \
  }                      \
  if constexpr (R > 2) { \
    X(2)                 \
  }                      \
  if constexpr (R > 3) { \
    X(3)                 \
  }
// The same for the packed kernels' up to 8 rows (rows 4..7 must be declared even when R <= 4).
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
#define TOWERS_V8(v) V32 &v##0, V32 &v##1, V32 &v##2, V32 &v##3, V32 &v##4, V32 &v##5, V32 &v##6, V32 &v##7
#define TOWERS_ZERO8(v, z) auto v##0 = z, v##1 = z, v##2 = z, v##3 = z, v##4 = z, v##5 = z, v##6 = z, v##7 = z;
#endif

#if defined(TOWERS_SIMD_QUANT_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TOWERS_SIMD_QUANT_DOT_INL_H_
#undef TOWERS_SIMD_QUANT_DOT_INL_H_
#else
#define TOWERS_SIMD_QUANT_DOT_INL_H_
#endif

#include <cstring>

#include <hwy/highway.h>

#include "simd/ggml_blocks.h"
#include "simd/quant_layout.h"

HWY_BEFORE_NAMESPACE();
namespace towers::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One f32 from a stored f16 (F16C where the target has it; the same value as fp16_to_f32).
HWY_INLINE float LoadF16(const Half& h) {
  const hn::CappedTag<float, 1> d1;
  const hn::Rebind<hwy::float16_t, decltype(d1)> dh1;
  return hn::GetLane(hn::PromoteTo(d1, hn::LoadU(dh1, reinterpret_cast<const hwy::float16_t*>(h.bytes))));
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

// All int32 lanes = the two int16 activation values at p.
template <class D16>
HWY_INLINE hn::Vec<D16> PairAt(D16 d16, const int16_t* HWY_RESTRICT p) {
  const hn::Repartition<int32_t, D16> d32;
  int32_t v;
  std::memcpy(&v, p, 4);
  return hn::BitCast(d16, hn::Set(d32, v));
}

// kIq4nlValues[idx] as int16 lanes, for 4-bit indices idx (one per lane).
template <class D16>
HWY_INLINE hn::Vec<D16> Iq4Values(D16 d16, hn::Vec<hn::Rebind<uint8_t, D16>> idx) {
#if HWY_TARGET == HWY_SCALAR
  return hn::Set(d16, static_cast<int16_t>(kIq4nlValues[hn::GetLane(idx)]));
#else
  const hn::Rebind<int8_t, D16> di8;
  if constexpr (HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL) {
    // 16 indices, 16 table bytes: one 128-bit pshufb.
    return hn::PromoteTo(d16, hn::TableLookupBytes(hn::LoadDup128(di8, kIq4nlValues), hn::BitCast(di8, idx)));
  } else {
    // A table vector of twice as many bytes as D16 has lanes (at least 16: the whole table in every
    // 128-bit block); the lookup returns the indices' (partial) vector type.
    const hn::Repartition<int8_t, D16> d8;
    return hn::PromoteTo(d16, hn::BitCast(di8, hn::TableLookupBytes(hn::LoadDup128(d8, kIq4nlValues), idx)));
  }
#endif
}

// Q2_K's and Q3_K's per-sub-block step in the packed kernels (every target): from l_i, the exact int32
// sums of sub-block sb's codes times activation row i (one lane per row of the slice), s_i += scale *
// l_i (Q3_K: scale * (l_i - 4 * the sub-block's 16-element sum), its codes being q + 4), and Q2_K's
// m_i += min * that sum. sc: the slice's scale bytes of sub-block sb (Q2_K scale | min << 4, Q3_K
// int8).
template <GgmlType kType, size_t R, class D32, class V32>
HWY_INLINE void LowBitScales(D32 d32, const uint8_t* HWY_RESTRICT sc, const qd::ActRow* A, size_t b, size_t sb,
                             TOWERS_V8(l), TOWERS_V8(s), TOWERS_V8(m)) {
  if constexpr (kType == GgmlType::Q2_K) {
    const hn::Rebind<uint8_t, D32> du8x32;
    const auto scb = hn::PromoteTo(d32, hn::LoadU(du8x32, sc));
    const auto scale = hn::And(scb, hn::Set(d32, 15));
    const auto mn = hn::ShiftRight<4>(scb);
#define TOWERS_SC(i)                                   \
  s##i = hn::Add(s##i, hn::Mul(l##i, scale)); \
  m##i = hn::Add(m##i, hn::Mul(mn, hn::Set(d32, A[i].bs16[16 * b + sb])));
    TOWERS_EACH_P(TOWERS_SC)
#undef TOWERS_SC
  } else {
    static_assert(kType == GgmlType::Q3_K);
    const hn::Rebind<int8_t, D32> di8x32;
    const auto scv = hn::PromoteTo(d32, hn::LoadU(di8x32, reinterpret_cast<const int8_t*>(sc)));
#define TOWERS_SC(i) s##i = hn::Add(s##i, hn::Mul(hn::Sub(l##i, hn::Set(d32, 4 * A[i].bs16[16 * b + sb])), scv));
    TOWERS_EACH_P(TOWERS_SC)
#undef TOWERS_SC
  }
}

// Q4_K's min term in the packed kernels, for up to 8 activation rows: m_i += sum_j min_j * bsum_j
// (exact int32 lanes, one per row of the slice), with the slice's mins as pairs at mn (4 chunks of
// 32 bytes; chunk k, row r: the mins of sub-blocks 2k and 2k + 1) and bsum_j A256's 32-element sums
// of block b.
template <size_t R, class D32, class V32>
HWY_INLINE void Q4KMinSums(D32 d32, const uint8_t* HWY_RESTRICT mn, const qd::ActRow* A, size_t b,
                           TOWERS_V8(m)) {
  const hn::Repartition<int16_t, D32> d16;
  const hn::RebindToUnsigned<decltype(d16)> du16;
  const hn::Rebind<uint8_t, decltype(d16)> du8;
  const auto z = hn::Zero(d32);
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

}  // namespace HWY_NAMESPACE
}  // namespace towers::simd
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
