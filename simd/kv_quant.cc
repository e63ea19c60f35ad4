// The attention kernels of the quantized KV vectors (layouts and rationale in kv_quant.h): scores and
// weighted sums straight from the codes, for one query (kv_dot_many, kv_accumulate) and for the query
// heads of one GQA group (the group kernels, whose passes of a single query use the one-query kernels:
// those are faster than a one-query pass of the group code, the scores running four vectors side by
// side; in-process 1.07-1.76x in 19 of 20 cases, bench/README.md issue 15). Highway code with run-time
// dispatch. (The scalar codec is kv_codec.cc.)
#include "simd/kv_quant.h"

#include <algorithm>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/kv_quant.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/cache_control.h>

#include "simd/kv_layout.h"

// Constants shared by all targets (defined once).
#ifndef TOWERS_SIMD_KV_QUANT_SHARED
#define TOWERS_SIMD_KV_QUANT_SHARED
namespace towers::simd::kvq {
// Vectors whose parameters are converted to f32 together by the weighted sums.
constexpr int kChunk = 64;
// The group kernels prefetch the vector this many rows ahead of the one they read. Attention walks
// one KV head's vectors, one row (all KV heads) apart: a few hundred bytes out of every row, so the
// hardware prefetchers see a sparse strided stream that stops at every 4 KiB. bench_attention (cold,
// 4096 rows, 1 thread, Zen 5): F16 ~470 -> ~200 ns per row, Q8 330 -> 200, Q4 410 -> 260; 16 to 64
// rows ahead all gave the same, 4-8 less. No effect on results (a prefetch is only a hint).
constexpr int kPrefetchRows = 16;

// Per-lane right shifts that spread one 32-bit word of 8 nibbles (or one 16-bit word of 8 2-bit
// fields) over 8 lanes, element k of the group in lane k.
alignas(32) inline constexpr uint32_t kShift4[8] = {0, 4, 8, 12, 16, 20, 24, 28};
alignas(32) inline constexpr uint32_t kShift2[8] = {0, 2, 4, 6, 8, 10, 12, 14};
}  // namespace towers::simd::kvq
#endif

HWY_BEFORE_NAMESPACE();
namespace towers::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace kvq;  // NOLINT

// 8 elements per group; 8 f32 lanes on AVX2/AVX-512 (256-bit ops), 4 on 128-bit targets (two
// halves per group), so a group never needs a tail.
using DF = hn::CappedTag<float, 8>;
using VF = hn::Vec<DF>;

// cnt f16 values at src -> f32 at dst.
HWY_INLINE void F16ToF32(const uint8_t* HWY_RESTRICT src, int cnt, float* HWY_RESTRICT dst) {
  const hwy::float16_t* s = reinterpret_cast<const hwy::float16_t*>(src);
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int N = static_cast<int>(hn::Lanes(df));
  int i = 0;
  for (; i + N <= cnt; i += N) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, s + i)), df, dst + i);
  const hn::CappedTag<float, 4> d4;
  const hn::Rebind<hwy::float16_t, decltype(d4)> dh4;
  const int N4 = static_cast<int>(hn::Lanes(d4));
  for (; i + N4 <= cnt; i += N4) hn::StoreU(hn::PromoteTo(d4, hn::LoadU(dh4, s + i)), d4, dst + i);
  const hn::CappedTag<float, 1> d1;
  const hn::Rebind<hwy::float16_t, decltype(d1)> dh1;
  for (; i < cnt; ++i) dst[i] = hn::GetLane(hn::PromoteTo(d1, hn::LoadU(dh1, s + i)));
}

// Lanes [h, h + Lanes) of the group of 8 elements starting at element e, as f32 (F32, F16, Q8).
template <KvQuant kQ>
HWY_INLINE VF DecodeGroup(const uint8_t* HWY_RESTRICT c, size_t e, size_t h) {
  const DF df;
  if constexpr (kQ == KvQuant::F32) {
    return hn::LoadU(df, reinterpret_cast<const float*>(c) + e + h);
  } else if constexpr (kQ == KvQuant::F16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(c) + e + h));
  } else {
    static_assert(kQ == KvQuant::Q8);
    const hn::RebindToSigned<DF> di;
    const hn::Rebind<int8_t, DF> di8;
    return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(di8, reinterpret_cast<const int8_t*>(c) + e + h)));
  }
}

// Lanes [h, h + Lanes) of the NG groups of 8 of the block starting at element e0, as f32, in x0..x3.
// NG == 4: a whole block of 32. NG < 4: the last block of a vector whose dim % 32 != 0.
// c: the codes (after the header); hi: Q6's 2-bit plane (layouts in kv_quant.h).
template <KvQuant kQ, int NG>
HWY_INLINE void DecodeBlock(const uint8_t* HWY_RESTRICT c, const uint8_t* HWY_RESTRICT hi, size_t e0, size_t h,
                            VF& x0, VF& x1, VF& x2, VF& x3) {
  const DF df;
  if constexpr (kQ == KvQuant::F32 || kQ == KvQuant::F16 || kQ == KvQuant::Q8) {
    x0 = DecodeGroup<kQ>(c, e0, h);
    if constexpr (NG > 1) x1 = DecodeGroup<kQ>(c, e0 + 8, h);
    if constexpr (NG > 2) x2 = DecodeGroup<kQ>(c, e0 + 16, h);
    if constexpr (NG > 3) x3 = DecodeGroup<kQ>(c, e0 + 24, h);
  } else {
    const hn::RebindToUnsigned<DF> du;
    const hn::RebindToSigned<DF> di;
    const hn::Rebind<uint8_t, DF> du8;
    const auto k15 = hn::Set(du, 15u);
    auto n0 = hn::Zero(du), n1 = n0, n2 = n0, n3 = n0;
    // Pairs of groups: 8 bytes, byte k = element k (low nibble) | element 8 + k (high nibble).
    if constexpr (NG >= 2) {
      const auto b = hn::PromoteTo(du, hn::LoadU(du8, c + e0 / 2 + h));
      n0 = hn::And(b, k15);
      n1 = hn::ShiftRight<4>(b);
    }
    if constexpr (NG == 4) {
      const auto b = hn::PromoteTo(du, hn::LoadU(du8, c + e0 / 2 + 8 + h));
      n2 = hn::And(b, k15);
      n3 = hn::ShiftRight<4>(b);
    }
    // A last single group: 4 bytes, element k at bit 4k of the little-endian word.
    if constexpr (NG == 1 || NG == 3) {
      uint32_t w;
      std::memcpy(&w, c + (e0 + 8 * (NG - 1)) / 2, 4);
      const auto v = hn::And(hn::Shr(hn::Set(du, w), hn::Load(du, kShift4 + h)), k15);
      if constexpr (NG == 1) n0 = v;
      else n2 = v;
    }
    if constexpr (kQ == KvQuant::Q6) {
      const auto k48 = hn::Set(du, 48u);
      if constexpr (NG == 4) {
        // 8 bytes, byte k = the high bits of elements k, 8+k, 16+k, 24+k at bits 0, 2, 4, 6.
        const auto H = hn::PromoteTo(du, hn::LoadU(du8, hi + e0 / 4 + h));
        n0 = hn::Or(n0, hn::And(hn::ShiftLeft<4>(H), k48));
        n1 = hn::Or(n1, hn::And(hn::ShiftLeft<2>(H), k48));
        n2 = hn::Or(n2, hn::And(H, k48));
        n3 = hn::Or(n3, hn::And(hn::ShiftRight<2>(H), k48));
      } else {
        // One 16-bit word per group, element k at bit 2k: ((hw << 4) >> 2k) & 48.
        const auto sh = hn::Load(du, kShift2 + h);
        uint16_t hw;
#define TOWERS_KV_HI(g, n)                                                                 \
  if constexpr (NG > g) {                                                                  \
    std::memcpy(&hw, hi + e0 / 4 + 2 * g, 2);                                              \
    n = hn::Or(n, hn::And(hn::Shr(hn::Set(du, static_cast<uint32_t>(hw) << 4), sh), k48));       \
  }
        TOWERS_KV_HI(0, n0)
        TOWERS_KV_HI(1, n1)
        TOWERS_KV_HI(2, n2)
#undef TOWERS_KV_HI
      }
    }
    x0 = hn::ConvertTo(df, hn::BitCast(di, n0));
    if constexpr (NG > 1) x1 = hn::ConvertTo(df, hn::BitCast(di, n1));
    if constexpr (NG > 2) x2 = hn::ConvertTo(df, hn::BitCast(di, n2));
    if constexpr (NG > 3) x3 = hn::ConvertTo(df, hn::BitCast(di, n3));
  }
}

// ---------------------------------------------------------------------------------------------
// Scores. Four vectors at a time (independent dependency chains; each query load serves four), by
// the same code whatever the group: a call with fewer than four left repeats its last vector and
// drops the extra results, so every score comes out of exactly the same operations.

#define TOWERS_KV_R4(X) X(0) X(1) X(2) X(3)

// t_r += q . codes of block (e0, NG) of vector r, for the four vectors.
template <KvQuant kQ, int NG>
HWY_INLINE void BlockDot4(const float* HWY_RESTRICT qv, size_t e0, const uint8_t* HWY_RESTRICT c0,
                          const uint8_t* HWY_RESTRICT c1, const uint8_t* HWY_RESTRICT c2,
                          const uint8_t* HWY_RESTRICT c3, size_t D, VF& t0, VF& t1, VF& t2, VF& t3) {
  const DF df;
  const size_t N = hn::Lanes(df);
  for (size_t h = 0; h < 8; h += N) {
    const auto q0 = hn::LoadU(df, qv + e0 + h);
    auto q1 = q0, q2 = q0, q3 = q0;
    if constexpr (NG > 1) q1 = hn::LoadU(df, qv + e0 + 8 + h);
    if constexpr (NG > 2) q2 = hn::LoadU(df, qv + e0 + 16 + h);
    if constexpr (NG > 3) q3 = hn::LoadU(df, qv + e0 + 24 + h);
#define TOWERS_KV_MAC(r)                                                    \
  {                                                                         \
    VF x0, x1, x2, x3;                                                      \
    DecodeBlock<kQ, NG>(c##r, c##r + D / 2, e0, h, x0, x1, x2, x3);         \
    t##r = hn::MulAdd(q0, x0, t##r);                                        \
    if constexpr (NG > 1) t##r = hn::MulAdd(q1, x1, t##r);                  \
    if constexpr (NG > 2) t##r = hn::MulAdd(q2, x2, t##r);                  \
    if constexpr (NG > 3) t##r = hn::MulAdd(q3, x3, t##r);                  \
  }
    TOWERS_KV_R4(TOWERS_KV_MAC)
#undef TOWERS_KV_MAC
  }
}

template <KvQuant kQ>
HWY_INLINE void Dot4(const float* HWY_RESTRICT qv, const float* HWY_RESTRICT qsum,
                     const uint8_t* HWY_RESTRICT v0, const uint8_t* HWY_RESTRICT v1,
                     const uint8_t* HWY_RESTRICT v2, const uint8_t* HWY_RESTRICT v3, size_t D,
                     float* HWY_RESTRICT out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  if constexpr (kQ == KvQuant::F32 || kQ == KvQuant::F16) {
    // Two accumulators per vector (even and odd groups), added at the end.
#define TOWERS_KV_DECL(r) auto a##r = hn::Zero(df), b##r = hn::Zero(df);
    TOWERS_KV_R4(TOWERS_KV_DECL)
#undef TOWERS_KV_DECL
    size_t e = 0;
    for (; e + 16 <= D; e += 16) {
      for (size_t h = 0; h < 8; h += N) {
        const auto qa = hn::LoadU(df, qv + e + h);
        const auto qb = hn::LoadU(df, qv + e + 8 + h);
#define TOWERS_KV_MAC(r)                                        \
  a##r = hn::MulAdd(qa, DecodeGroup<kQ>(v##r, e, h), a##r);     \
  b##r = hn::MulAdd(qb, DecodeGroup<kQ>(v##r, e + 8, h), b##r);
        TOWERS_KV_R4(TOWERS_KV_MAC)
#undef TOWERS_KV_MAC
      }
    }
    if (e < D) {
      for (size_t h = 0; h < 8; h += N) {
        const auto qa = hn::LoadU(df, qv + e + h);
#define TOWERS_KV_MAC(r) a##r = hn::MulAdd(qa, DecodeGroup<kQ>(v##r, e, h), a##r);
        TOWERS_KV_R4(TOWERS_KV_MAC)
#undef TOWERS_KV_MAC
      }
    }
#define TOWERS_KV_OUT(r) out[r] = hn::GetLane(hn::SumOfLanes(df, hn::Add(a##r, b##r)));
    TOWERS_KV_R4(TOWERS_KV_OUT)
#undef TOWERS_KV_OUT
  } else {
    constexpr int P = params_per_block(kQ);
    const int nb = n_blocks(static_cast<int>(D));
    const size_t hdr = header_bytes(kQ, static_cast<int>(D));
    HWY_ALIGN float prm[4][2 * kMaxBlocks];
#define TOWERS_KV_PREP(r)                         \
  F16ToF32(v##r, P * nb, prm[r]);                 \
  const uint8_t* HWY_RESTRICT c##r = v##r + hdr;  \
  auto acc##r = hn::Zero(df);
    TOWERS_KV_R4(TOWERS_KV_PREP)
#undef TOWERS_KV_PREP
    for (int b = 0; b < nb; ++b) {
      const size_t e0 = size_t(b) * kKvBlock;
      auto t0 = hn::Zero(df), t1 = t0, t2 = t0, t3 = t0;
      switch ((std::min(D, e0 + kKvBlock) - e0) / 8) {
        case 4: BlockDot4<kQ, 4>(qv, e0, c0, c1, c2, c3, D, t0, t1, t2, t3); break;
        case 3: BlockDot4<kQ, 3>(qv, e0, c0, c1, c2, c3, D, t0, t1, t2, t3); break;
        case 2: BlockDot4<kQ, 2>(qv, e0, c0, c1, c2, c3, D, t0, t1, t2, t3); break;
        default: BlockDot4<kQ, 1>(qv, e0, c0, c1, c2, c3, D, t0, t1, t2, t3); break;
      }
#define TOWERS_KV_SCALE(r) acc##r = hn::MulAdd(hn::Set(df, prm[r][P * b]), t##r, acc##r);
      TOWERS_KV_R4(TOWERS_KV_SCALE)
#undef TOWERS_KV_SCALE
      if constexpr (P == 2) {
        for (size_t h = 0; h < 8; h += N) {
          const auto qs = hn::Load(df, qsum + 8 * b + h);
#define TOWERS_KV_MIN(r) acc##r = hn::MulAdd(hn::Set(df, prm[r][2 * b + 1]), qs, acc##r);
          TOWERS_KV_R4(TOWERS_KV_MIN)
#undef TOWERS_KV_MIN
        }
      }
    }
#define TOWERS_KV_OUT(r) out[r] = hn::GetLane(hn::SumOfLanes(df, acc##r));
    TOWERS_KV_R4(TOWERS_KV_OUT)
#undef TOWERS_KV_OUT
  }
}
#undef TOWERS_KV_R4

template <KvQuant kQ>
HWY_NOINLINE void DotManyT(const float* HWY_RESTRICT qv, const uint8_t* HWY_RESTRICT k, size_t stride,
                           int n, int dim, float* HWY_RESTRICT scores) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const size_t D = static_cast<size_t>(dim);
  // Lane-wise sums of q over each block (the min term of Q6/Q4), once per call.
  HWY_ALIGN float qsum[kMaxBlocks * 8];
  if constexpr (params_per_block(kQ) == 2) {
    for (int b = 0; b < n_blocks(dim); ++b) {
      const size_t e0 = size_t(b) * kKvBlock, e1 = std::min(D, e0 + kKvBlock);
      for (size_t h = 0; h < 8; h += N) {
        auto s = hn::Zero(df);
        for (size_t e = e0; e < e1; e += 8) s = hn::Add(s, hn::LoadU(df, qv + e + h));
        hn::Store(s, df, qsum + 8 * b + h);
      }
    }
  }
  for (int j = 0; j < n; j += 4) {
    const int cnt = std::min(4, n - j);
    const uint8_t* v0 = k + size_t(j) * stride;
    const uint8_t* v1 = cnt > 1 ? v0 + stride : v0;
    const uint8_t* v2 = cnt > 2 ? v1 + stride : v1;
    const uint8_t* v3 = cnt > 3 ? v2 + stride : v2;
    HWY_ALIGN float out[4];
    Dot4<kQ>(qv, qsum, v0, v1, v2, v3, D, out);
    for (int r = 0; r < cnt; ++r) scores[j + r] = out[r];
  }
}

// ---------------------------------------------------------------------------------------------
// Weighted sums. Tiled by block (up to 4 groups of 8 kept in registers) over a chunk of vectors, so
// each acc element sees the vectors in ascending order and only acc carries state between them.

// One block (NG groups of 8 starting at element e0), lanes [h, h + Lanes), vectors [j0, j1).
// F32/F16: w[j] = p[j]. Q8: w[j] = p[j] * d. Q6/Q4: w[j] = (p[j] * d, p[j] * m).
template <KvQuant kQ, int NG>
HWY_INLINE void AccBlock(const float* HWY_RESTRICT w, int wstride, const uint8_t* HWY_RESTRICT v,
                         size_t stride, int j0, int j1, size_t hdr, size_t D, size_t e0, size_t h,
                         float* HWY_RESTRICT acc) {
  const DF df;
  auto a0 = hn::LoadU(df, acc + e0 + h);
  auto a1 = a0, a2 = a0, a3 = a0;
  if constexpr (NG > 1) a1 = hn::LoadU(df, acc + e0 + 8 + h);
  if constexpr (NG > 2) a2 = hn::LoadU(df, acc + e0 + 16 + h);
  if constexpr (NG > 3) a3 = hn::LoadU(df, acc + e0 + 24 + h);
  for (int j = j0; j < j1; ++j) {
    const uint8_t* HWY_RESTRICT c = v + size_t(j) * stride + hdr;
    const float* wj = w + (j - j0) * wstride;
    const auto vs = hn::Set(df, wj[0]);
    VF x0, x1, x2, x3;
    DecodeBlock<kQ, NG>(c, c + D / 2, e0, h, x0, x1, x2, x3);
    if constexpr (params_per_block(kQ) == 2) {
      const auto vm = hn::Set(df, wj[1]);
      a0 = hn::Add(a0, hn::MulAdd(vs, x0, vm));
      if constexpr (NG > 1) a1 = hn::Add(a1, hn::MulAdd(vs, x1, vm));
      if constexpr (NG > 2) a2 = hn::Add(a2, hn::MulAdd(vs, x2, vm));
      if constexpr (NG > 3) a3 = hn::Add(a3, hn::MulAdd(vs, x3, vm));
    } else {
      a0 = hn::MulAdd(vs, x0, a0);
      if constexpr (NG > 1) a1 = hn::MulAdd(vs, x1, a1);
      if constexpr (NG > 2) a2 = hn::MulAdd(vs, x2, a2);
      if constexpr (NG > 3) a3 = hn::MulAdd(vs, x3, a3);
    }
  }
  hn::StoreU(a0, df, acc + e0 + h);
  if constexpr (NG > 1) hn::StoreU(a1, df, acc + e0 + 8 + h);
  if constexpr (NG > 2) hn::StoreU(a2, df, acc + e0 + 16 + h);
  if constexpr (NG > 3) hn::StoreU(a3, df, acc + e0 + 24 + h);
}

template <KvQuant kQ>
HWY_NOINLINE void AccumulateT(const float* HWY_RESTRICT p, const uint8_t* HWY_RESTRICT v, size_t stride,
                              int n, int dim, float* HWY_RESTRICT acc) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const size_t D = static_cast<size_t>(dim);
  constexpr int P = params_per_block(kQ);
  const int nb = n_blocks(dim);
  const size_t hdr = header_bytes(kQ, dim);
  // Per vector of the chunk: the weights of every block (P per block; F32/F16: p[j] alone).
  constexpr int kW = P == 0 ? 1 : 2 * kMaxBlocks;
  HWY_ALIGN float w[kChunk * kW];
  for (int j0 = 0; j0 < n; j0 += kChunk) {
    const int j1 = std::min(n, j0 + kChunk);
    if constexpr (P == 0) {
      std::memcpy(w, p + j0, sizeof(float) * size_t(j1 - j0));
    } else {
      for (int j = j0; j < j1; ++j) {
        float* wj = w + (j - j0) * kW;
        F16ToF32(v + size_t(j) * stride, P * nb, wj);
        for (int i = 0; i < P * nb; ++i) wj[i] = p[j] * wj[i];
      }
    }
    for (int b = 0; b < nb; ++b) {
      const size_t e0 = size_t(b) * kKvBlock;
      const float* wb = w + (P == 0 ? 0 : P * b);
      for (size_t h = 0; h < 8; h += N) {
        switch ((std::min(D, e0 + kKvBlock) - e0) / 8) {
          case 4: AccBlock<kQ, 4>(wb, kW, v, stride, j0, j1, hdr, D, e0, h, acc); break;
          case 3: AccBlock<kQ, 3>(wb, kW, v, stride, j0, j1, hdr, D, e0, h, acc); break;
          case 2: AccBlock<kQ, 2>(wb, kW, v, stride, j0, j1, hdr, D, e0, h, acc); break;
          default: AccBlock<kQ, 1>(wb, kW, v, stride, j0, j1, hdr, D, e0, h, acc); break;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Group kernels: up to four query heads (G) that share one KV head, in one pass over the vectors.
// Each vector (or block of it) is loaded and decoded once for the G queries instead of once per query.
// Every (vector, query) score and every (query, element) sum goes through exactly the operations, in
// the same order, of the single-query kernels above (Dot4 / AccBlock), so the results are the same
// bits; only which independent chains run side by side changes.

#define TOWERS_KV_G4(X) X(0) X(1) X(2) X(3)

// Lane-wise sums of q over each block (the min term of Q6/Q4); the same code as DotManyT's.
HWY_INLINE void BlockSumsQ(const float* HWY_RESTRICT qv, size_t D, float* HWY_RESTRICT qsum) {
  const DF df;
  const size_t N = hn::Lanes(df);
  for (int b = 0; b < n_blocks(static_cast<int>(D)); ++b) {
    const size_t e0 = size_t(b) * kKvBlock, e1 = std::min(D, e0 + kKvBlock);
    for (size_t h = 0; h < 8; h += N) {
      auto s = hn::Zero(df);
      for (size_t e = e0; e < e1; e += 8) s = hn::Add(s, hn::LoadU(df, qv + e + h));
      hn::Store(s, df, qsum + 8 * b + h);
    }
  }
}

// t_g += q_g . codes of block (e0, NG) of one vector, for the G queries (BlockDot4's order per query).
template <KvQuant kQ, int NG, int G>
HWY_INLINE void BlockDotG(const float* HWY_RESTRICT q0, const float* HWY_RESTRICT q1,
                          const float* HWY_RESTRICT q2, const float* HWY_RESTRICT q3, size_t e0,
                          const uint8_t* HWY_RESTRICT c, size_t D, VF& t0, VF& t1, VF& t2, VF& t3) {
  const DF df;
  const size_t N = hn::Lanes(df);
  for (size_t h = 0; h < 8; h += N) {
    VF x0, x1, x2, x3;
    DecodeBlock<kQ, NG>(c, c + D / 2, e0, h, x0, x1, x2, x3);
#define TOWERS_KV_MAC(g)                                                                 \
  if constexpr (G > g) {                                                                 \
    t##g = hn::MulAdd(hn::LoadU(df, q##g + e0 + h), x0, t##g);                           \
    if constexpr (NG > 1) t##g = hn::MulAdd(hn::LoadU(df, q##g + e0 + 8 + h), x1, t##g);   \
    if constexpr (NG > 2) t##g = hn::MulAdd(hn::LoadU(df, q##g + e0 + 16 + h), x2, t##g);  \
    if constexpr (NG > 3) t##g = hn::MulAdd(hn::LoadU(df, q##g + e0 + 24 + h), x3, t##g);  \
  }
    TOWERS_KV_G4(TOWERS_KV_MAC)
#undef TOWERS_KV_MAC
  }
}

// Asks for the cache lines of vector j + kPrefetchRows of the rows at base (stride apart, vb bytes
// each) when that vector is below n_end (no fault either way: a prefetch is only a hint).
HWY_INLINE void PrefetchAhead(const uint8_t* base, int j, int n_end, size_t stride, size_t vb) {
  if (j + kPrefetchRows >= n_end) return;
  const uint8_t* p = base + size_t(j + kPrefetchRows) * stride;
  for (size_t o = 0; o < vb; o += 64) hwy::Prefetch(p + o);
  hwy::Prefetch(p + vb - 1);
}

// Asks for the cache lines of vectors [from, to) (a prefetch is only a hint).
HWY_INLINE void PrefetchRows(const uint8_t* base, int from, int to, size_t stride, size_t vb) {
  for (int j = from; j < to; ++j) {
    const uint8_t* p = base + size_t(j) * stride;
    for (size_t o = 0; o < vb; o += 64) hwy::Prefetch(p + o);
    hwy::Prefetch(p + vb - 1);
  }
}

// s_g[j] = q_g . vector j for j < n, g < G. Vector j + kPrefetchRows is prefetched while vector j is
// read, when it is below n + n_ahead (the caller's next rows).
template <KvQuant kQ, int G>
HWY_NOINLINE void DotGroupT(const float* const* HWY_RESTRICT qp, const uint8_t* HWY_RESTRICT k, size_t stride,
                            int n, int n_ahead, int dim, float* const* HWY_RESTRICT sp) {
  const int n_end = n + n_ahead;
  const size_t vb = vec_bytes(kQ, dim);
  const DF df;
  const size_t N = hn::Lanes(df);
  const size_t D = static_cast<size_t>(dim);
  constexpr int P = params_per_block(kQ);
  const float* HWY_RESTRICT q0 = qp[0];
  const float* HWY_RESTRICT q1 = qp[G > 1 ? 1 : 0];
  const float* HWY_RESTRICT q2 = qp[G > 2 ? 2 : 0];
  const float* HWY_RESTRICT q3 = qp[G > 3 ? 3 : 0];
  HWY_ALIGN float qsum[4][kMaxBlocks * 8];
  if constexpr (P == 2) {
#define TOWERS_KV_QS(g) \
  if constexpr (G > g) BlockSumsQ(q##g, D, qsum[g]);
    TOWERS_KV_G4(TOWERS_KV_QS)
#undef TOWERS_KV_QS
  }
  if constexpr (kQ == KvQuant::F32 || kQ == KvQuant::F16) {
    for (int j = 0; j < n; ++j) {
      const uint8_t* HWY_RESTRICT v = k + size_t(j) * stride;
      PrefetchAhead(k, j, n_end, stride, vb);
      // Two accumulators per query (even and odd groups), as Dot4.
      auto a0 = hn::Zero(df), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
      size_t e = 0;
      for (; e + 16 <= D; e += 16) {
        for (size_t h = 0; h < 8; h += N) {
          const VF xa = DecodeGroup<kQ>(v, e, h), xb = DecodeGroup<kQ>(v, e + 8, h);
#define TOWERS_KV_MAC(g)                                           \
  if constexpr (G > g) {                                           \
    a##g = hn::MulAdd(hn::LoadU(df, q##g + e + h), xa, a##g);      \
    b##g = hn::MulAdd(hn::LoadU(df, q##g + e + 8 + h), xb, b##g);  \
  }
          TOWERS_KV_G4(TOWERS_KV_MAC)
#undef TOWERS_KV_MAC
        }
      }
      if (e < D) {
        for (size_t h = 0; h < 8; h += N) {
          const VF xa = DecodeGroup<kQ>(v, e, h);
#define TOWERS_KV_MAC(g) \
  if constexpr (G > g) a##g = hn::MulAdd(hn::LoadU(df, q##g + e + h), xa, a##g);
          TOWERS_KV_G4(TOWERS_KV_MAC)
#undef TOWERS_KV_MAC
        }
      }
#define TOWERS_KV_OUT(g) \
  if constexpr (G > g) sp[g][j] = hn::GetLane(hn::SumOfLanes(df, hn::Add(a##g, b##g)));
      TOWERS_KV_G4(TOWERS_KV_OUT)
#undef TOWERS_KV_OUT
    }
  } else {
    const int nb = n_blocks(dim);
    const size_t hdr = header_bytes(kQ, dim);
    HWY_ALIGN float prm[2 * kMaxBlocks];
    for (int j = 0; j < n; ++j) {
      const uint8_t* HWY_RESTRICT v = k + size_t(j) * stride;
      PrefetchAhead(k, j, n_end, stride, vb);
      F16ToF32(v, P * nb, prm);
      const uint8_t* HWY_RESTRICT c = v + hdr;
      auto acc0 = hn::Zero(df), acc1 = acc0, acc2 = acc0, acc3 = acc0;
      for (int b = 0; b < nb; ++b) {
        const size_t e0 = size_t(b) * kKvBlock;
        auto t0 = hn::Zero(df), t1 = t0, t2 = t0, t3 = t0;
        switch ((std::min(D, e0 + kKvBlock) - e0) / 8) {
          case 4: BlockDotG<kQ, 4, G>(q0, q1, q2, q3, e0, c, D, t0, t1, t2, t3); break;
          case 3: BlockDotG<kQ, 3, G>(q0, q1, q2, q3, e0, c, D, t0, t1, t2, t3); break;
          case 2: BlockDotG<kQ, 2, G>(q0, q1, q2, q3, e0, c, D, t0, t1, t2, t3); break;
          default: BlockDotG<kQ, 1, G>(q0, q1, q2, q3, e0, c, D, t0, t1, t2, t3); break;
        }
        const auto sd = hn::Set(df, prm[P * b]);
#define TOWERS_KV_SCALE(g) \
  if constexpr (G > g) acc##g = hn::MulAdd(sd, t##g, acc##g);
        TOWERS_KV_G4(TOWERS_KV_SCALE)
#undef TOWERS_KV_SCALE
        if constexpr (P == 2) {
          const auto sm = hn::Set(df, prm[2 * b + 1]);
          for (size_t h = 0; h < 8; h += N) {
#define TOWERS_KV_MIN(g) \
  if constexpr (G > g) acc##g = hn::MulAdd(sm, hn::Load(df, qsum[g] + 8 * b + h), acc##g);
            TOWERS_KV_G4(TOWERS_KV_MIN)
#undef TOWERS_KV_MIN
          }
        }
      }
#define TOWERS_KV_OUT(g) \
  if constexpr (G > g) sp[g][j] = hn::GetLane(hn::SumOfLanes(df, acc##g));
      TOWERS_KV_G4(TOWERS_KV_OUT)
#undef TOWERS_KV_OUT
    }
  }
}

// AccBlock for G queries over groups [K0, K1) of block (e0, NG), lanes [h, h + Lanes), vectors [j0, j1):
// each vector's groups are decoded once and added to the G accumulators (w_g as in AccBlock).
template <KvQuant kQ, int NG, int K0, int K1, int G>
HWY_INLINE void AccBlockG(const float* const* HWY_RESTRICT wp, int wstride, const uint8_t* HWY_RESTRICT v,
                          size_t stride, int j0, int j1, size_t hdr, size_t D, size_t e0, size_t h,
                          float* const* HWY_RESTRICT ap) {
  const DF df;
  const float* HWY_RESTRICT w0 = wp[0];
  const float* HWY_RESTRICT w1 = wp[G > 1 ? 1 : 0];
  const float* HWY_RESTRICT w2 = wp[G > 2 ? 2 : 0];
  const float* HWY_RESTRICT w3 = wp[G > 3 ? 3 : 0];
  float* HWY_RESTRICT acc0 = ap[0];
  float* HWY_RESTRICT acc1 = ap[G > 1 ? 1 : 0];
  float* HWY_RESTRICT acc2 = ap[G > 2 ? 2 : 0];
  float* HWY_RESTRICT acc3 = ap[G > 3 ? 3 : 0];
  const VF z = hn::Zero(df);
  // a<g><k>: query g, group k of the block.
#define TOWERS_KV_ON(g, k) (G > g && K0 <= k && k < K1)
#define TOWERS_KV_LD(g, k) \
  VF a##g##k = z;          \
  if constexpr (TOWERS_KV_ON(g, k)) a##g##k = hn::LoadU(df, acc##g + e0 + 8 * k + h);
#define TOWERS_KV_EACH(X, g) X(g, 0) X(g, 1) X(g, 2) X(g, 3)
#define TOWERS_KV_ALL(X) TOWERS_KV_EACH(X, 0) TOWERS_KV_EACH(X, 1) TOWERS_KV_EACH(X, 2) TOWERS_KV_EACH(X, 3)
  TOWERS_KV_ALL(TOWERS_KV_LD)
#undef TOWERS_KV_LD
  for (int j = j0; j < j1; ++j) {
    const uint8_t* HWY_RESTRICT c = v + size_t(j) * stride + hdr;
    const size_t wo = size_t(j - j0) * size_t(wstride);
    VF x0, x1, x2, x3;
    DecodeBlock<kQ, NG>(c, c + D / 2, e0, h, x0, x1, x2, x3);
    if constexpr (params_per_block(kQ) == 2) {
#define TOWERS_KV_UPD(g, k) \
  if constexpr (TOWERS_KV_ON(g, k)) a##g##k = hn::Add(a##g##k, hn::MulAdd(vs, x##k, vm));
#define TOWERS_KV_HEAD(g)                     \
  if constexpr (G > g) {                      \
    const auto vs = hn::Set(df, w##g[wo]);     \
    const auto vm = hn::Set(df, w##g[wo + 1]); \
    TOWERS_KV_EACH(TOWERS_KV_UPD, g)          \
  }
      TOWERS_KV_G4(TOWERS_KV_HEAD)
#undef TOWERS_KV_HEAD
#undef TOWERS_KV_UPD
    } else {
#define TOWERS_KV_UPD(g, k) \
  if constexpr (TOWERS_KV_ON(g, k)) a##g##k = hn::MulAdd(vs, x##k, a##g##k);
#define TOWERS_KV_HEAD(g)                 \
  if constexpr (G > g) {                  \
    const auto vs = hn::Set(df, w##g[wo]); \
    TOWERS_KV_EACH(TOWERS_KV_UPD, g)      \
  }
      TOWERS_KV_G4(TOWERS_KV_HEAD)
#undef TOWERS_KV_HEAD
#undef TOWERS_KV_UPD
    }
  }
#define TOWERS_KV_ST(g, k) \
  if constexpr (TOWERS_KV_ON(g, k)) hn::StoreU(a##g##k, df, acc##g + e0 + 8 * k + h);
  TOWERS_KV_ALL(TOWERS_KV_ST)
#undef TOWERS_KV_ST
#undef TOWERS_KV_ALL
#undef TOWERS_KV_EACH
#undef TOWERS_KV_ON
}

// With 32 vector registers (AVX-512) a whole block's accumulators for four queries (16) stay in
// registers; with 16, the block is done in two passes of two groups (the codes are decoded per pass).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr bool kWholeBlockG = true;
#else
constexpr bool kWholeBlockG = false;
#endif

template <KvQuant kQ, int NG, int G>
HWY_INLINE void AccBlockPasses(const float* const* wp, int wstride, const uint8_t* v, size_t stride, int j0,
                               int j1, size_t hdr, size_t D, size_t e0, size_t h, float* const* ap) {
  if constexpr (kWholeBlockG || NG <= 2) {
    AccBlockG<kQ, NG, 0, NG, G>(wp, wstride, v, stride, j0, j1, hdr, D, e0, h, ap);
  } else {
    AccBlockG<kQ, NG, 0, 2, G>(wp, wstride, v, stride, j0, j1, hdr, D, e0, h, ap);
    AccBlockG<kQ, NG, 2, NG, G>(wp, wstride, v, stride, j0, j1, hdr, D, e0, h, ap);
  }
}

// ---------------------------------------------------------------------------------------------
// x86: the same arithmetic laid out for wide vectors (keys in lanes, staged sums).
#include "simd/kv_quant_x86-inl.h"  // NOLINT(build/include)

// acc_g[i] += sum_j p_g[j] * dequant(vector j)[i] for g < G; AccumulateT's operations per query.
template <KvQuant kQ, int G>
HWY_NOINLINE void AccumulateGroupT(const float* const* HWY_RESTRICT pp, const uint8_t* HWY_RESTRICT v,
                                   size_t stride, int n, int n_ahead, int dim, float* const* HWY_RESTRICT ap) {
  const int n_end = n + n_ahead;
  const size_t vb = vec_bytes(kQ, dim);
  const DF df;
  const size_t N = hn::Lanes(df);
  const size_t D = static_cast<size_t>(dim);
  constexpr int P = params_per_block(kQ);
  const int nb = n_blocks(dim);
  const size_t hdr = header_bytes(kQ, dim);
  constexpr int kW = P == 0 ? 1 : 2 * kMaxBlocks;
  HWY_ALIGN float w[G][kChunk * kW];
  HWY_ALIGN float prm[2 * kMaxBlocks];
  for (int j0 = 0; j0 < n; j0 += kChunk) {
    const int j1 = std::min(n, j0 + kChunk);
    for (int j = j0; j < j1; ++j) {
      PrefetchAhead(v, j, n_end, stride, vb);
      if constexpr (P == 0) {
        for (int g = 0; g < G; ++g) w[g][j - j0] = pp[g][j];
      } else {
        F16ToF32(v + size_t(j) * stride, P * nb, prm);
        for (int g = 0; g < G; ++g) {
          float* wj = w[g] + (j - j0) * kW;
          for (int i = 0; i < P * nb; ++i) wj[i] = pp[g][j] * prm[i];
        }
      }
    }
    for (int b = 0; b < nb; ++b) {
      const size_t e0 = size_t(b) * kKvBlock;
      const float* wb[4];
      for (int g = 0; g < G; ++g) wb[g] = w[g] + (P == 0 ? 0 : P * b);
      for (size_t h = 0; h < 8; h += N) {
        switch ((std::min(D, e0 + kKvBlock) - e0) / 8) {
          case 4: AccBlockPasses<kQ, 4, G>(wb, kW, v, stride, j0, j1, hdr, D, e0, h, ap); break;
          case 3: AccBlockPasses<kQ, 3, G>(wb, kW, v, stride, j0, j1, hdr, D, e0, h, ap); break;
          case 2: AccBlockPasses<kQ, 2, G>(wb, kW, v, stride, j0, j1, hdr, D, e0, h, ap); break;
          default: AccBlockPasses<kQ, 1, G>(wb, kW, v, stride, j0, j1, hdr, D, e0, h, ap); break;
        }
      }
    }
  }
}
#undef TOWERS_KV_G4

template <KvQuant kQ>
void DotGroupQ(const float* qv, int n_q, const uint8_t* k, size_t stride, int n, int n_ahead, int dim,
               float* scores, size_t score_stride) {
#ifdef TOWERS_KV_KEYS_IN_LANES
  if (n_q >= kKeysInLanesMinQueries) {
    if constexpr (kQ == KvQuant::F32 || kQ == KvQuant::F16) {
      DotKeysInLanes<kQ>(qv, n_q, k, stride, n, n_ahead, dim, scores, score_stride);
    } else {
      DotQuantKeysInLanes<kQ>(qv, n_q, k, stride, n, n_ahead, dim, scores, score_stride);
    }
    return;
  }
#endif
  for (int g0 = 0; g0 < n_q; g0 += 4) {
    const int G = std::min(4, n_q - g0);
    const float* qp[4];
    float* sp[4];
    for (int g = 0; g < G; ++g) {
      qp[g] = qv + size_t(g0 + g) * size_t(dim);
      sp[g] = scores + size_t(g0 + g) * score_stride;
    }
    switch (G) {
      case 4: DotGroupT<kQ, 4>(qp, k, stride, n, n_ahead, dim, sp); break;
      case 3: DotGroupT<kQ, 3>(qp, k, stride, n, n_ahead, dim, sp); break;
      case 2: DotGroupT<kQ, 2>(qp, k, stride, n, n_ahead, dim, sp); break;
      default: DotManyT<kQ>(qp[0], k, stride, n, dim, sp[0]); break;
    }
  }
}

template <KvQuant kQ>
void AccumulateGroupQ(const float* p, size_t p_stride, int n_q, const uint8_t* v, size_t stride, int n, int n_ahead,
                      int dim, float* acc) {
#ifdef TOWERS_KV_WIDE_SUMS
  if (n_q >= kKeysInLanesMinQueries) {
    AccumulateStaged<kQ>(p, p_stride, n_q, v, stride, n, n_ahead, dim, acc);
    return;
  }
#endif
  for (int g0 = 0; g0 < n_q; g0 += 4) {
    const int G = std::min(4, n_q - g0);
    const float* pp[4];
    float* ap[4];
    for (int g = 0; g < G; ++g) {
      pp[g] = p + size_t(g0 + g) * p_stride;
      ap[g] = acc + size_t(g0 + g) * size_t(dim);
    }
#ifdef TOWERS_KV_WIDE_SUMS
    if constexpr (kQ == KvQuant::F32 || kQ == KvQuant::F16) {
      switch (G) {
        case 4: AccumulateWideG<kQ, 4>(pp, v, stride, n, n_ahead, dim, ap); break;
        case 3: AccumulateWideG<kQ, 3>(pp, v, stride, n, n_ahead, dim, ap); break;
        case 2: AccumulateWideG<kQ, 2>(pp, v, stride, n, n_ahead, dim, ap); break;
        default: AccumulateWideG<kQ, 1>(pp, v, stride, n, n_ahead, dim, ap); break;
      }
      continue;
    }
#endif
    switch (G) {
      case 4: AccumulateGroupT<kQ, 4>(pp, v, stride, n, n_ahead, dim, ap); break;
      case 3: AccumulateGroupT<kQ, 3>(pp, v, stride, n, n_ahead, dim, ap); break;
      case 2: AccumulateGroupT<kQ, 2>(pp, v, stride, n, n_ahead, dim, ap); break;
      default: AccumulateT<kQ>(pp[0], v, stride, n, dim, ap[0]); break;
    }
  }
}

void DotGroup(KvQuant q, const float* qv, int n_q, const void* k, size_t stride, int n, int n_ahead, int dim,
              float* scores, size_t score_stride) {
  const auto* kb = static_cast<const uint8_t*>(k);
  switch (q) {
    case KvQuant::F32: return DotGroupQ<KvQuant::F32>(qv, n_q, kb, stride, n, n_ahead, dim, scores, score_stride);
    case KvQuant::F16: return DotGroupQ<KvQuant::F16>(qv, n_q, kb, stride, n, n_ahead, dim, scores, score_stride);
    case KvQuant::Q8: return DotGroupQ<KvQuant::Q8>(qv, n_q, kb, stride, n, n_ahead, dim, scores, score_stride);
    case KvQuant::Q6: return DotGroupQ<KvQuant::Q6>(qv, n_q, kb, stride, n, n_ahead, dim, scores, score_stride);
    case KvQuant::Q4: return DotGroupQ<KvQuant::Q4>(qv, n_q, kb, stride, n, n_ahead, dim, scores, score_stride);
  }
}

void AccumulateGroup(KvQuant q, const float* p, size_t p_stride, int n_q, const void* v, size_t stride, int n,
                     int n_ahead, int dim, float* acc) {
  const auto* vb = static_cast<const uint8_t*>(v);
  switch (q) {
    case KvQuant::F32: return AccumulateGroupQ<KvQuant::F32>(p, p_stride, n_q, vb, stride, n, n_ahead, dim, acc);
    case KvQuant::F16: return AccumulateGroupQ<KvQuant::F16>(p, p_stride, n_q, vb, stride, n, n_ahead, dim, acc);
    case KvQuant::Q8: return AccumulateGroupQ<KvQuant::Q8>(p, p_stride, n_q, vb, stride, n, n_ahead, dim, acc);
    case KvQuant::Q6: return AccumulateGroupQ<KvQuant::Q6>(p, p_stride, n_q, vb, stride, n, n_ahead, dim, acc);
    case KvQuant::Q4: return AccumulateGroupQ<KvQuant::Q4>(p, p_stride, n_q, vb, stride, n, n_ahead, dim, acc);
  }
}

void DotMany(KvQuant q, const float* qv, const void* k, size_t stride, int n, int dim, float* scores) {
  const auto* kb = static_cast<const uint8_t*>(k);
  switch (q) {
    case KvQuant::F32: return DotManyT<KvQuant::F32>(qv, kb, stride, n, dim, scores);
    case KvQuant::F16: return DotManyT<KvQuant::F16>(qv, kb, stride, n, dim, scores);
    case KvQuant::Q8: return DotManyT<KvQuant::Q8>(qv, kb, stride, n, dim, scores);
    case KvQuant::Q6: return DotManyT<KvQuant::Q6>(qv, kb, stride, n, dim, scores);
    case KvQuant::Q4: return DotManyT<KvQuant::Q4>(qv, kb, stride, n, dim, scores);
  }
}

void Accumulate(KvQuant q, const float* p, const void* v, size_t stride, int n, int dim, float* acc) {
  const auto* vb = static_cast<const uint8_t*>(v);
  switch (q) {
    case KvQuant::F32: return AccumulateT<KvQuant::F32>(p, vb, stride, n, dim, acc);
    case KvQuant::F16: return AccumulateT<KvQuant::F16>(p, vb, stride, n, dim, acc);
    case KvQuant::Q8: return AccumulateT<KvQuant::Q8>(p, vb, stride, n, dim, acc);
    case KvQuant::Q6: return AccumulateT<KvQuant::Q6>(p, vb, stride, n, dim, acc);
    case KvQuant::Q4: return AccumulateT<KvQuant::Q4>(p, vb, stride, n, dim, acc);
  }
}

// (Per target: foreach_target compiles this file once for each.)
#undef TOWERS_KV_KEYS_IN_LANES
#undef TOWERS_KV_WIDE_SUMS

}  // namespace HWY_NAMESPACE
}  // namespace towers::simd
HWY_AFTER_NAMESPACE();


#if HWY_ONCE
namespace towers::simd {
HWY_EXPORT(DotMany);
HWY_EXPORT(Accumulate);
HWY_EXPORT(DotGroup);
HWY_EXPORT(AccumulateGroup);

void kv_dot_many(KvQuant q, const float* qv, const void* k, size_t stride, int n, int dim, float* scores) {
  if (!kvq::quant_ok(q, dim) || n <= 0) return;
  HWY_DYNAMIC_DISPATCH(DotMany)(q, qv, k, stride, n, dim, scores);
}

void kv_accumulate(KvQuant q, const float* p, const void* v, size_t stride, int n, int dim, float* acc) {
  if (!kvq::quant_ok(q, dim) || n <= 0) return;
  HWY_DYNAMIC_DISPATCH(Accumulate)(q, p, v, stride, n, dim, acc);
}

void kv_dot_group(KvQuant q, const float* qv, int n_q, const void* k, size_t stride, int n, int dim, float* scores,
                  size_t score_stride, int n_ahead) {
  if (!kvq::quant_ok(q, dim) || n <= 0 || n_q <= 0) return;
  HWY_DYNAMIC_DISPATCH(DotGroup)(q, qv, n_q, k, stride, n, std::max(n_ahead, 0), dim, scores, score_stride);
}

void kv_accumulate_group(KvQuant q, const float* p, size_t p_stride, int n_q, const void* v, size_t stride, int n,
                         int dim, float* acc, int n_ahead) {
  if (!kvq::quant_ok(q, dim) || n <= 0 || n_q <= 0) return;
  HWY_DYNAMIC_DISPATCH(AccumulateGroup)(q, p, p_stride, n_q, v, stride, n, std::max(n_ahead, 0), dim, acc);
}


}  // namespace towers::simd
#endif
