// The packed kernels' exact int32 block sums with the Armv8.2 dot product (sdot), included by
// gemm_packed.cc for Highway's NEON target on aarch64 and used where the CPU has it (HWCAP_ASIMDDP;
// simd::packed_dotprod()). Highway's SVE targets keep the int16 madd kernels.
//
// Inline assembly, because Highway 1.0.3 has no int8 dot product into int32 lanes (later releases
// added SumOfMulQuadAccumulate), and the intrinsic (vdotq_laneq_s32) needs its caller compiled for
// +dotprod, which the NEON target must not be: it also runs on Armv8.0 cores. The `.arch` line in
// the asm lets the assembler take the instruction (`.arch_extension dotprod` is refused by Debian 12's
// binutils); it names a superset of what the compiler emits for the NEON target (armv8-a+crypto), so
// later code in the file assembles as before. The caller checks the CPU before any sdot runs.
//
// Every sum is the same integer as PackedSums computes with Highway's int16 madd, so the results are
// the same bits (test "quant_dot packed: NEON with and without sdot").
#if defined(TOWERS_SIMD_GEMM_PACKED_SDOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TOWERS_SIMD_GEMM_PACKED_SDOT_INL_H_
#undef TOWERS_SIMD_GEMM_PACKED_SDOT_INL_H_
#else
#define TOWERS_SIMD_GEMM_PACKED_SDOT_INL_H_
#endif

#include <hwy/highway.h>

#include "simd/quant_dot-inl.h"
#include "simd/quant_layout.h"

#if HWY_TARGET == HWY_NEON && HWY_ARCH_ARM_A64
#include <arm_neon.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace towers::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_NEON && HWY_ARCH_ARM_A64
using namespace qd;  // NOLINT

// acc (int32 lane r) += the 4 int8 products of w's lane r with x's 4-byte group kGroup.
template <int kGroup>
HWY_INLINE int32x4_t Sdot(int32x4_t acc, uint8x16_t w, int8x16_t x) {
  asm(".arch armv8.2-a+dotprod+crypto\n\tsdot %0.4s, %1.16b, %2.4b[%3]"
      : "+w"(acc)
      : "w"(w), "w"(x), "n"(kGroup));
  return acc;
}
// 16 consecutive activations x against four weight vectors whose lanes hold, per row, the weights
// of x's 4-byte groups 0, 1, 2 and 3. (Weights as unsigned bytes: every code here is < 128 or, for
// Q8_0 and the IQ4 values, the int8 itself; sdot reads both operands as signed.)
HWY_INLINE int32x4_t Dot16(int32x4_t acc, uint8x16_t w0, uint8x16_t w1, uint8x16_t w2, uint8x16_t w3,
                           const int8_t* HWY_RESTRICT x) {
  const int8x16_t xv = vld1q_s8(x);
  return Sdot<3>(Sdot<2>(Sdot<1>(Sdot<0>(acc, w0, xv), w1, xv), w2, xv), w3, xv);
}
// Lane r = the 2 bytes of row r of the slice in chunk p, then its 2 bytes in chunk p + 1 (32 bytes
// on): elements 2p..2p+3 of the row's element run.
HWY_INLINE uint8x16_t PairChunks(const uint8_t* HWY_RESTRICT chunk) {
  const uint16x4_t a = vreinterpret_u16_u8(vld1_u8(chunk)), b = vreinterpret_u16_u8(vld1_u8(chunk + 32));
  return vreinterpretq_u8_u16(vcombine_u16(vzip1_u16(a, b), vzip2_u16(a, b)));
}
// Lane r = row r's 2 bytes of one chunk, twice.
HWY_INLINE uint8x16_t DupChunk(const uint8_t* HWY_RESTRICT chunk) {
  const uint16x4_t a = vreinterpret_u16_u8(vld1_u8(chunk));
  return vreinterpretq_u8_u16(vcombine_u16(vzip1_u16(a, a), vzip2_u16(a, a)));
}

// Bits of v shifted right by n (the same n in every byte), masked, shifted left by `up`.
HWY_INLINE uint8x16_t BitsAt(uint8x16_t v, int n, uint8_t mask, int up) {
  const uint8x16_t b = vandq_u8(vshlq_u8(v, vdupq_n_s8(static_cast<int8_t>(-n))), vdupq_n_u8(mask));
  return vshlq_u8(b, vdupq_n_s8(static_cast<int8_t>(up)));
}
// The IQ4 codebook values of 4-bit indices (as bytes: sdot reads them as the signed values).
HWY_INLINE uint8x16_t Iq4(uint8x16_t idx) {
  return vreinterpretq_u8_s8(vqtbl1q_s8(vld1q_s8(kIq4nlValues), idx));
}

// Exact int32 sums of one 4-row slice (rows sl..sl+3) of packed block b, as PackedSums.
template <GgmlType kType, size_t R, class D32, class V32>
HWY_INLINE void PackedSumsSdot(D32 d32, const uint8_t* HWY_RESTRICT blk, size_t sl, const ActRow* A,
                               size_t b, TOWERS_V8(s), TOWERS_V8(m)) {
  static_assert(std::is_same_v<decltype(V32().raw), int32x4_t>, "one 4-row slice per vector");
  const size_t e = b * act_block(kType);
  const auto z = hn::Zero(d32);
  s0 = z, s1 = z, s2 = z, s3 = z, s4 = z, s5 = z, s6 = z, s7 = z;
  m0 = z, m1 = z, m2 = z, m3 = z, m4 = z, m5 = z, m6 = z, m7 = z;
  const int32x4_t zero = vdupq_n_s32(0);
  const uint8x16_t k0F = vdupq_n_u8(0x0F);
  if constexpr (kType == kQ8_0) {
    const uint8_t* HWY_RESTRICT qs = blk + kPackedQs + 2 * sl;
    uint8x16_t w[8];
    for (size_t k = 0; k < 8; ++k) w[k] = PairChunks(qs + 64 * k);  // elements 4k..4k+3
#define TOWERS_DOT(i)                                                               \
  s##i = V32{Dot16(Dot16(zero, w[0], w[1], w[2], w[3], A[i].q8 + e), w[4], w[5], w[6], \
                   w[7], A[i].q8 + e + 16)};
    TOWERS_EACH_P(TOWERS_DOT)
#undef TOWERS_DOT
  } else if constexpr (kType == kQ4_0) {
    const uint8_t* HWY_RESTRICT qs = blk + kPackedQs + 2 * sl;
    uint8x16_t lo[4], hi[4];
    for (size_t k = 0; k < 4; ++k) {
      const uint8x16_t v = PairChunks(qs + 64 * k);
      lo[k] = vandq_u8(v, k0F);   // elements 4k..4k+3
      hi[k] = vshrq_n_u8(v, 4);  // elements 16+4k..
    }
    // sum (q - 8) * x = sum q * x - 8 * sum x, exactly in int32.
#define TOWERS_DOT(i)                                                                                    \
  s##i = hn::Sub(V32{Dot16(Dot16(zero, lo[0], lo[1], lo[2], lo[3], A[i].q8 + e), hi[0], hi[1], hi[2], \
                           hi[3], A[i].q8 + e + 16)},                                                    \
                 hn::Set(d32, 8 * A[i].s[b]));
    TOWERS_EACH_P(TOWERS_DOT)
#undef TOWERS_DOT
  } else if constexpr (kType == kIQ4_NL || kType == kQ4_1 || kType == kQ5_0 || kType == kQ5_1) {
    // Q4_0's chunks: IQ4_NL's nibbles through the codebook; Q5_0 / Q5_1 with their fifth bits (each
    // row's two plane bytes twice in its lane, shifted by p for chunk p's bytes, p + 1 for chunk
    // p + 1's); Q5_0 minus 16 * sum(x).
    const uint8_t* HWY_RESTRICT qs = blk + packed_qs_at(kType) + 2 * sl;
    const uint8_t* HWY_RESTRICT qh = blk + packed_qh_at(kType) + 2 * sl;
    uint8x16_t lo[4], hi[4];
    [[maybe_unused]] const uint8x16_t H0 = DupChunk(qh), H1 = DupChunk(qh + 32);  // Q5_0 / Q5_1 planes
    for (size_t k = 0; k < 4; ++k) {
      const uint8x16_t v = PairChunks(qs + 64 * k);
      lo[k] = vandq_u8(v, k0F);   // elements 4k..4k+3
      hi[k] = vshrq_n_u8(v, 4);  // elements 16+4k..
      if constexpr (kType == kIQ4_NL) {
        lo[k] = Iq4(lo[k]);
        hi[k] = Iq4(hi[k]);
      } else if constexpr (kType != kQ4_1) {
        const uint8_t a = static_cast<uint8_t>(-static_cast<int>(2 * k)), c = static_cast<uint8_t>(-static_cast<int>(2 * k + 1));
        const int8x16_t shift = vreinterpretq_s8_u32(vdupq_n_u32(a | a << 8 | c << 16 | static_cast<uint32_t>(c) << 24));
        const uint8x16_t k01 = vdupq_n_u8(1);
        lo[k] = vorrq_u8(lo[k], vshlq_n_u8(vandq_u8(vshlq_u8(H0, shift), k01), 4));
        hi[k] = vorrq_u8(hi[k], vshlq_n_u8(vandq_u8(vshlq_u8(H1, shift), k01), 4));
      }
    }
#define TOWERS_DOT(i)                                                                                  \
  s##i = V32{Dot16(Dot16(zero, lo[0], lo[1], lo[2], lo[3], A[i].q8 + e), hi[0], hi[1], hi[2], hi[3], \
                   A[i].q8 + e + 16)};                                                                 \
  if constexpr (kType == kQ5_0) s##i = hn::Sub(s##i, hn::Set(d32, 16 * A[i].s[b]));
    TOWERS_EACH_P(TOWERS_DOT)
#undef TOWERS_DOT
  } else if constexpr (kType == kIQ4_XS) {
    // Per sub-block j of 32: IQ4_NL's sum, times the row's int8 scale.
    const hn::Rebind<int8_t, D32> di8x32;
    const int8_t* HWY_RESTRICT sc = reinterpret_cast<const int8_t*>(blk + kIQ4XSScales) + sl;
    const uint8_t* HWY_RESTRICT q = blk + kIQ4XSQuants + 2 * sl;
    for (size_t j = 0; j < 8; ++j) {
      uint8x16_t lo[4], hi[4];
      for (size_t k = 0; k < 4; ++k) {
        const uint8x16_t v = PairChunks(q + kIQ4XSSubBytes * j + 64 * k);
        lo[k] = Iq4(vandq_u8(v, k0F));
        hi[k] = Iq4(vshrq_n_u8(v, 4));
      }
      const auto scv = hn::PromoteTo(d32, hn::LoadU(di8x32, sc + kPackRows * j));
#define TOWERS_DOT(i)                                                                                  \
  s##i = hn::Add(s##i, hn::Mul(V32{Dot16(Dot16(zero, lo[0], lo[1], lo[2], lo[3], A[i].q8 + e + 32 * j), \
                                         hi[0], hi[1], hi[2], hi[3], A[i].q8 + e + 32 * j + 16)},      \
                               scv));
      TOWERS_EACH_P(TOWERS_DOT)
#undef TOWERS_DOT
    }
  } else if constexpr (kType == kQ2_K || kType == kQ3_K) {
    // Per sub-block sb = 8h + 2j + k of 16: the 2-bit codes at bits 2j of chunks 16h + 8k + p (Q3_K:
    // | bit 4h + j of hmask chunk 8k + p, at bit 2), as PackedSums.
    const uint8_t* HWY_RESTRICT q = blk + packed_qs_at(kType) + 2 * sl;
    const uint8_t* HWY_RESTRICT hm = blk + kQ3KHmask + 2 * sl;
    const uint8_t* HWY_RESTRICT sc = blk + packed_scales_at(kType) + sl;
    // The chunk pairs of (h, k) (and their hmask pairs) are paired once for its 4 sub-blocks j;
    // unrolled, so every shift is an immediate. The int32 sums are exact: the order of the sub-blocks
    // does not change them.
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
      for (int k = 0; k < 2; ++k) {
        uint8x16_t qp[4], hp[4];
#pragma GCC unroll 4
        for (size_t pp = 0; pp < 4; ++pp) {  // elements 4pp.. of each sub-block of (h, k)
          qp[pp] = PairChunks(q + 32 * (16 * h + 8 * k + 2 * pp));
          hp[pp] = kType == kQ3_K ? PairChunks(hm + 32 * (8 * k + 2 * pp)) : qp[pp];
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const size_t sb = static_cast<size_t>(8 * h + 2 * j + k);
          uint8x16_t w[4];
#pragma GCC unroll 4
          for (size_t pp = 0; pp < 4; ++pp) {
            w[pp] = BitsAt(qp[pp], 2 * j, 3, 0);
            if constexpr (kType == kQ3_K) w[pp] = vorrq_u8(w[pp], BitsAt(hp[pp], 4 * h + j, 1, 2));
          }
          TOWERS_ZERO8(l, z)
#define TOWERS_DOT(i) l##i = V32{Dot16(zero, w[0], w[1], w[2], w[3], A[i].q8 + e + 16 * sb)};
          TOWERS_EACH_P(TOWERS_DOT)
#undef TOWERS_DOT
          LowBitScales<kType, R>(d32, sc + kPackRows * sb, A, b, sb, l0, l1, l2, l3, l4, l5, l6, l7, s0, s1, s2, s3,
                                 s4, s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7);
        }
      }
    }
  } else if constexpr (kType == kQ6_K) {
    // Per 16-element scale group g: the 6-bit codes (0..63) times x, minus 32 * the group's
    // activation sum (A256 bs16), is sum (q - 32) * x; times the row's int8 scale. Chunk pair j
    // (chunks 2j, 2j+1 of the low 4 bits) takes its top 2 bits from qh chunk j: bits 0-1 and 2-3 of
    // each byte for chunk 2j's low and high nibbles, bits 4-5 and 6-7 for chunk 2j+1's.
    const hn::Rebind<int8_t, D32> di8x32;
    const int8_t* HWY_RESTRICT sc = reinterpret_cast<const int8_t*>(blk + kQ6KScales) + sl;
    const uint8_t* HWY_RESTRICT q = blk + kQ6KGroups + 2 * sl;
    const int8x16_t shift_lo = vreinterpretq_s8_s32(vdupq_n_s32(static_cast<int32_t>(0xFCFC0000u)));  // 0,0,-4,-4
    const int8x16_t shift_hi = vreinterpretq_s8_s32(vdupq_n_s32(static_cast<int32_t>(0xFAFAFEFEu)));  // -2,-2,-6,-6
    const uint8x16_t k03 = vdupq_n_u8(3);
    for (size_t g = 0; g < 16; ++g) {
      const uint8_t* HWY_RESTRICT ql = q + g * kQ6KGroupBytes;
      const uint8_t* HWY_RESTRICT qh = ql + 128;
      uint8x16_t lo[2], hi[2];
      for (size_t j = 0; j < 2; ++j) {
        const uint8x16_t L = PairChunks(ql + 64 * j), H = DupChunk(qh + 32 * j);
        lo[j] = vorrq_u8(vandq_u8(L, k0F), vshlq_n_u8(vandq_u8(vshlq_u8(H, shift_lo), k03), 4));  // 4j..4j+3
        hi[j] = vorrq_u8(vshrq_n_u8(L, 4), vshlq_n_u8(vandq_u8(vshlq_u8(H, shift_hi), k03), 4));  // 8+4j..
      }
      const auto scv = hn::PromoteTo(d32, hn::LoadU(di8x32, sc + 16 * g));
#define TOWERS_DOT(i)                                                                         \
  s##i = hn::Add(s##i, hn::Mul(hn::Sub(V32{Dot16(zero, lo[0], lo[1], hi[0], hi[1], A[i].q8 + e + 16 * g)}, \
                                       hn::Set(d32, 32 * A[i].bs16[16 * b + g])),              \
                               scv));
      TOWERS_EACH_P(TOWERS_DOT)
#undef TOWERS_DOT
    }
  } else {
    static_assert(kType == kQ4_K || kType == kQ5_K);
    // Per 64-element part c: sub-block 2c in the low nibbles, 2c+1 in the high ones (Q5_K: their fifth
    // bits at bits 2c, 2c+1 of the qh chunks); each sub-block's exact sum of q * x times the row's
    // 6-bit scale, as PackedSums; then the min term.
    const hn::Rebind<uint8_t, D32> du8x32;
    const uint8_t* HWY_RESTRICT sc = blk + kQ4KScales + sl;
    const uint8_t* HWY_RESTRICT q = blk + kQ4KQuants + 2 * sl;
    for (size_t c = 0; c < 4; ++c) {
      uint8x16_t lo[8], hi[8];
      for (size_t k = 0; k < 8; ++k) {
        const uint8x16_t v = PairChunks(q + 512 * c + 64 * k);
        lo[k] = vandq_u8(v, k0F);   // elements 64c + 4k..
        hi[k] = vshrq_n_u8(v, 4);  // elements 64c + 32 + 4k..
        if constexpr (kType == kQ5_K) {
          const uint8x16_t H = PairChunks(blk + kQ5KQh + 2 * sl + 64 * k);
          lo[k] = vorrq_u8(lo[k], BitsAt(H, static_cast<int>(2 * c), 1, 4));
          hi[k] = vorrq_u8(hi[k], BitsAt(H, static_cast<int>(2 * c + 1), 1, 4));
        }
      }
      const auto scl = hn::PromoteTo(d32, hn::LoadU(du8x32, sc + 32 * c));
      const auto sch = hn::PromoteTo(d32, hn::LoadU(du8x32, sc + 32 * c + 16));
      const size_t ec = e + 64 * c;
#define TOWERS_DOT(i)                                                                                     \
  {                                                                                                       \
    const int8_t* HWY_RESTRICT x = A[i].q8 + ec;                                                          \
    const V32 l{Dot16(Dot16(zero, lo[0], lo[1], lo[2], lo[3], x), lo[4], lo[5], lo[6], lo[7], x + 16)};   \
    const V32 h{Dot16(Dot16(zero, hi[0], hi[1], hi[2], hi[3], x + 32), hi[4], hi[5], hi[6], hi[7], x + 48)}; \
    s##i = hn::Add(s##i, hn::Add(hn::Mul(l, scl), hn::Mul(h, sch)));                                     \
  }
      TOWERS_EACH_P(TOWERS_DOT)
#undef TOWERS_DOT
    }
    Q4KMinSums<R>(d32, blk + kQ4KMins + 2 * sl, A, b, m0, m1, m2, m3, m4, m5, m6, m7);
  }
}
#endif  // HWY_TARGET == HWY_NEON && HWY_ARCH_ARM_A64

}  // namespace HWY_NAMESPACE
}  // namespace towers::simd
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
