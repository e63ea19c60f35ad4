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
// x86 (AVX2 and AVX-512): the same arithmetic as above, laid out for wide vectors. Every format for
// many queries per call (a prefill tile's 64 query heads: scores with keys in lanes, sums over a
// staged f32 copy of the vectors), and F32/F16 sums in 16 lanes for any number (AVX-512).
//
// Scores, keys in lanes. Per (query, key) the kernels above run two chains of 8 lanes: lane i of
// `a` sums q_e k_e for e = i, 16 + i, 32 + i, ... (then the tail element D16 + i when dim % 16 == 8),
// lane i of `b` for e = 8 + i, 24 + i, ...; then x = a + b, and the score is Highway's 8-lane
// SumOfLanes of x: ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)). Here a block of kNK keys (8 or
// 16, the f32 lanes) is transposed once, element e of key t at kt[e * kNK + t], and serves every
// query of the call: chain i of a query is a run of kNK-wide fused multiply-adds of a broadcast q_e
// with row e of kt, and each node of the tree is one vector add. The same operations on the same
// values in the same order per score, so the same bits (tests/test_kv_quant.cc, "group kernels give
// each query's single-query bits", n_q >= 8), with no horizontal sum per score and every FMA kNK
// wide. The transposition costs several queries' FMAs, so it pays from kKeysInLanesMinQueries queries
// per call (at 4, a decode step's, it was 1.7x slower: bench/ab, "kv_attend n_q=4").
//
// Weighted sums, 16 lanes (AVX-512). They are elementwise (acc[e] = fma(p_j, x_e, acc[e]), j
// ascending), so 16 lanes give the bits of 8 with half the instructions.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define TOWERS_KV_KEYS_IN_LANES 1
using DK = hn::ScalableTag<float>;
using VK = hn::Vec<DK>;
constexpr size_t kNK = hn::MaxLanes(DK());
static_assert(kNK == 8 || kNK == 16, "x86 f32 vectors");
// Queries per pass over a transposed block: their 16 chains' partial sums stay in registers (4 x ~6
// vectors of 32 on AVX-512, 2 of 16 on AVX2).
constexpr int kQueriesPerPass = kNK == 16 ? 4 : 2;
// From this many queries per call the transposition pays (bench/ab, "kv_attend n_q=4").
constexpr int kKeysInLanesMinQueries = 8;

// Elements [e, e + kNK) of a vector (the upper half zero when `half`: the last 8 of dim % 16 == 8).
template <KvQuant kQ, bool kHalf>
HWY_INLINE VK LoadWide(const uint8_t* HWY_RESTRICT row, size_t e) {
  const DK dk;
  if constexpr (kHalf) {
    const hn::Half<DK> dh;
    if constexpr (kQ == KvQuant::F32) {
      return hn::ZeroExtendVector(dk, hn::LoadU(dh, reinterpret_cast<const float*>(row) + e));
    } else {
      const hn::Rebind<hwy::float16_t, decltype(dh)> d16;
      return hn::ZeroExtendVector(dk, hn::PromoteTo(dh, hn::LoadU(d16, reinterpret_cast<const hwy::float16_t*>(row) + e)));
    }
  } else if constexpr (kQ == KvQuant::F32) {
    return hn::LoadU(dk, reinterpret_cast<const float*>(row) + e);
  } else {
    const hn::Rebind<hwy::float16_t, DK> d16;
    return hn::PromoteTo(dk, hn::LoadU(d16, reinterpret_cast<const hwy::float16_t*>(row) + e));
  }
}

// r[t] = elements c..c + kNK of key t  ->  r[e] = element c + e of keys 0 .. kNK - 1. log2(kNK)
// rounds of ConcatEven / ConcatOdd, each rotating the bits of (row, column) right by one.
HWY_INLINE void TransposeSquare(VK* HWY_RESTRICT r) {
  const DK dk;
#pragma GCC unroll 4
  for (size_t round = 1; round < kNK; round *= 2) {
    VK t[kNK];
#pragma GCC unroll 8
    for (size_t p = 0; p < kNK / 2; ++p) {
      t[p] = hn::ConcatEven(dk, r[2 * p + 1], r[2 * p]);
      t[p + kNK / 2] = hn::ConcatOdd(dk, r[2 * p + 1], r[2 * p]);
    }
#pragma GCC unroll 16
    for (size_t p = 0; p < kNK; ++p) r[p] = t[p];
  }
}

template <KvQuant kQ, bool kHalf>
HWY_INLINE void TransposeColumns(const uint8_t* const* HWY_RESTRICT rows, size_t c, size_t w,
                                 float* HWY_RESTRICT kt) {
  const DK dk;
  VK r[kNK];
#pragma GCC unroll 16
  for (size_t t = 0; t < kNK; ++t) r[t] = LoadWide<kQ, kHalf>(rows[t], c);
  TransposeSquare(r);
  for (size_t e = 0; e < w; ++e) hn::Store(r[e], dk, kt + (c + e) * kNK);
}

// Keys j .. j + cnt - 1 (k + j*stride ...) transposed into kt; lanes past cnt repeat the last key.
template <KvQuant kQ>
HWY_INLINE void TransposeKeys(const uint8_t* HWY_RESTRICT k, size_t stride, int j, int cnt, int n_end, size_t D,
                              float* HWY_RESTRICT kt) {
  const uint8_t* rows[kNK];
  const size_t vb = vec_bytes(kQ, static_cast<int>(D));
  for (size_t t = 0; t < kNK; ++t) {
    rows[t] = k + size_t(j + std::min<int>(static_cast<int>(t), cnt - 1)) * stride;
    if (static_cast<int>(t) < cnt) PrefetchAhead(k, j + static_cast<int>(t), n_end, stride, vb);
  }
  size_t c = 0;
  for (; c + kNK <= D; c += kNK) TransposeColumns<kQ, false>(rows, c, kNK, kt);
  if (c < D) TransposeColumns<kQ, true>(rows, c, D - c, kt);  // the last 8 (kNK == 16)
}

// x_g = lane i of the 8-lane kernels' a + b for the G queries: chain i (c_g = fma(q_g[e], kt row e,
// c_g) for e = i, i + 16, ... below D16, then the tail element D16 + i when `tail`) plus chain i + 8.
// The two chains run in one loop: 2G independent FMA chains for the out-of-order core.
template <int G>
HWY_INLINE void PairG(const float* HWY_RESTRICT q0, const float* HWY_RESTRICT q1, const float* HWY_RESTRICT q2,
                      const float* HWY_RESTRICT q3, const float* HWY_RESTRICT kt, size_t D16, bool tail, size_t i,
                      VK& x0, VK& x1, VK& x2, VK& x3) {
  const DK dk;
  VK b0, b1, b2, b3;
  x0 = x1 = x2 = x3 = b0 = b1 = b2 = b3 = hn::Zero(dk);
  for (size_t e = i; e < D16; e += 16) {
    const VK ca = hn::Load(dk, kt + e * kNK), cb = hn::Load(dk, kt + (e + 8) * kNK);
#define TOWERS_KV_FMA(g)                                      \
  if constexpr (G > g) {                                      \
    x##g = hn::MulAdd(hn::Set(dk, q##g[e]), ca, x##g);        \
    b##g = hn::MulAdd(hn::Set(dk, q##g[e + 8]), cb, b##g);    \
  }
    TOWERS_KV_G4(TOWERS_KV_FMA)
#undef TOWERS_KV_FMA
  }
  if (tail) {
    const size_t e = D16 + i;
    const VK ca = hn::Load(dk, kt + e * kNK);
#define TOWERS_KV_FMA(g) \
  if constexpr (G > g) x##g = hn::MulAdd(hn::Set(dk, q##g[e]), ca, x##g);
    TOWERS_KV_G4(TOWERS_KV_FMA)
#undef TOWERS_KV_FMA
  }
#define TOWERS_KV_ADD(g) \
  if constexpr (G > g) x##g = hn::Add(x##g, b##g);
  TOWERS_KV_G4(TOWERS_KV_ADD)
#undef TOWERS_KV_ADD
}

// The first cnt lanes of a block's scores to s[0 .. cnt).
HWY_INLINE void StoreScores(VK score, float* HWY_RESTRICT s, int cnt) {
  const DK dk;
  if (cnt == static_cast<int>(kNK)) {
    hn::StoreU(score, dk, s);
  } else {
    HWY_ALIGN float tmp[kNK];
    hn::Store(score, dk, tmp);
    std::memcpy(s, tmp, sizeof(float) * size_t(cnt));
  }
}

// s_g[j .. j + cnt) = the scores of the G queries against the transposed block kt.
template <int G>
HWY_NOINLINE void ScoresG(const float* const* HWY_RESTRICT qp, const float* HWY_RESTRICT kt, size_t D,
                          float* const* HWY_RESTRICT sp, int j, int cnt) {
  const float* HWY_RESTRICT q0 = qp[0];
  const float* HWY_RESTRICT q1 = qp[G > 1 ? 1 : 0];
  const float* HWY_RESTRICT q2 = qp[G > 2 ? 2 : 0];
  const float* HWY_RESTRICT q3 = qp[G > 3 ? 3 : 0];
  const size_t D16 = D / 16 * 16;
  const bool tail = D16 < D;
  VK x0, x1, x2, x3, y0, y1, y2, y3, u0, u1, u2, u3, w0, w1, w2, w3;
  // u = (x0 + x4) + (x2 + x6)
  PairG<G>(q0, q1, q2, q3, kt, D16, tail, 0, x0, x1, x2, x3);
  PairG<G>(q0, q1, q2, q3, kt, D16, tail, 4, y0, y1, y2, y3);
#define TOWERS_KV_U(g) \
  if constexpr (G > g) u##g = hn::Add(x##g, y##g);
  TOWERS_KV_G4(TOWERS_KV_U)
#undef TOWERS_KV_U
  PairG<G>(q0, q1, q2, q3, kt, D16, tail, 2, x0, x1, x2, x3);
  PairG<G>(q0, q1, q2, q3, kt, D16, tail, 6, y0, y1, y2, y3);
#define TOWERS_KV_U(g) \
  if constexpr (G > g) u##g = hn::Add(u##g, hn::Add(x##g, y##g));
  TOWERS_KV_G4(TOWERS_KV_U)
#undef TOWERS_KV_U
  // w = (x1 + x5) + (x3 + x7)
  PairG<G>(q0, q1, q2, q3, kt, D16, tail, 1, x0, x1, x2, x3);
  PairG<G>(q0, q1, q2, q3, kt, D16, tail, 5, y0, y1, y2, y3);
#define TOWERS_KV_W(g) \
  if constexpr (G > g) w##g = hn::Add(x##g, y##g);
  TOWERS_KV_G4(TOWERS_KV_W)
#undef TOWERS_KV_W
  PairG<G>(q0, q1, q2, q3, kt, D16, tail, 3, x0, x1, x2, x3);
  PairG<G>(q0, q1, q2, q3, kt, D16, tail, 7, y0, y1, y2, y3);
#define TOWERS_KV_OUT(g) \
  if constexpr (G > g) StoreScores(hn::Add(u##g, hn::Add(w##g, hn::Add(x##g, y##g))), sp[g] + j, cnt);
  TOWERS_KV_G4(TOWERS_KV_OUT)
#undef TOWERS_KV_OUT
}

// kv_dot_group for F32/F16 with keys in lanes (n_q >= kKeysInLanesMinQueries).
template <KvQuant kQ>
HWY_NOINLINE void DotKeysInLanes(const float* HWY_RESTRICT qv, int n_q, const uint8_t* HWY_RESTRICT k, size_t stride,
                                 int n, int n_ahead, int dim, float* HWY_RESTRICT scores, size_t score_stride) {
  HWY_ALIGN float kt[kKvMaxDim * kNK];
  const size_t D = static_cast<size_t>(dim);
  for (int j = 0; j < n; j += static_cast<int>(kNK)) {
    const int cnt = std::min(static_cast<int>(kNK), n - j);
    TransposeKeys<kQ>(k, stride, j, cnt, n + n_ahead, D, kt);
    for (int g0 = 0; g0 < n_q; g0 += kQueriesPerPass) {
      const int G = std::min(kQueriesPerPass, n_q - g0);
      const float* qp[4];
      float* sp[4];
      for (int g = 0; g < G; ++g) {
        qp[g] = qv + size_t(g0 + g) * D;
        sp[g] = scores + size_t(g0 + g) * score_stride;
      }
      switch (G) {
        case 4: ScoresG<4>(qp, kt, D, sp, j, cnt); break;
        case 3: ScoresG<3>(qp, kt, D, sp, j, cnt); break;
        case 2: ScoresG<2>(qp, kt, D, sp, j, cnt); break;
        default: ScoresG<1>(qp, kt, D, sp, j, cnt); break;
      }
    }
  }
}

// Scores of Q8/Q6/Q4 keys with keys in lanes. Per block b the 8-lane kernels run, for lane i, the
// chain t = fma(q_e, c_e, t) over e = 32b + i, + 8, + 16, + 24 (the block's groups, fewer in a last
// partial block), then acc_i = fma(d_b, t, acc_i) and, for Q6/Q4, acc_i = fma(m_b, qsum_bi, acc_i)
// (qsum_bi: the block's q_e of lane i summed, BlockSumsQ); the score is the tree of acc_0 .. acc_7 as
// for F32. Here the codes (as f32) are transposed like F32 keys and d_b, m_b of the kNK keys are
// vectors: the same operations per score, so the same bits. Decoding a block of keys once serves
// every query of the call.

// The codes of one Q8/Q6/Q4 vector (c: after its parameters) as f32, out[0 .. D).
template <KvQuant kQ>
HWY_INLINE void DecodeCodes(const uint8_t* HWY_RESTRICT c, size_t D, float* HWY_RESTRICT out) {
  const DF df;
  const int nb = n_blocks(static_cast<int>(D));
  for (int b = 0; b < nb; ++b) {
    const size_t e0 = size_t(b) * kKvBlock;
    VF x0, x1, x2, x3;
    switch ((std::min(D, e0 + kKvBlock) - e0) / 8) {
      case 4:
        DecodeBlock<kQ, 4>(c, c + D / 2, e0, 0, x0, x1, x2, x3);
        hn::StoreU(x3, df, out + e0 + 24);
        hn::StoreU(x2, df, out + e0 + 16);
        hn::StoreU(x1, df, out + e0 + 8);
        break;
      case 3:
        DecodeBlock<kQ, 3>(c, c + D / 2, e0, 0, x0, x1, x2, x3);
        hn::StoreU(x2, df, out + e0 + 16);
        hn::StoreU(x1, df, out + e0 + 8);
        break;
      case 2:
        DecodeBlock<kQ, 2>(c, c + D / 2, e0, 0, x0, x1, x2, x3);
        hn::StoreU(x1, df, out + e0 + 8);
        break;
      default: DecodeBlock<kQ, 1>(c, c + D / 2, e0, 0, x0, x1, x2, x3); break;
    }
    hn::StoreU(x0, df, out + e0);
  }
}

// Keys j .. j + cnt - 1 decoded and transposed: codes into kt (as TransposeKeys), parameter i of
// the keys (d_0, [m_0,] d_1, ...) at prm_t[i * kNK + lane]. rows: kNK * dim floats of scratch.
template <KvQuant kQ>
HWY_INLINE void TransposeQuantKeys(const uint8_t* HWY_RESTRICT k, size_t stride, int j, int cnt, int n_end, size_t D,
                                   float* HWY_RESTRICT rows, float* HWY_RESTRICT kt, float* HWY_RESTRICT prm_t) {
  constexpr int P = params_per_block(kQ);
  const int nb = n_blocks(static_cast<int>(D));
  const size_t hdr = header_bytes(kQ, static_cast<int>(D)), vb = vec_bytes(kQ, static_cast<int>(D));
  const uint8_t* row_ptr[kNK];
  HWY_ALIGN float prm[2 * kMaxBlocks];
  for (size_t t = 0; t < kNK; ++t) {
    if (static_cast<int>(t) >= cnt) {  // lanes past cnt repeat the last key
      row_ptr[t] = row_ptr[cnt - 1];
      for (int i = 0; i < P * nb; ++i) prm_t[size_t(i) * kNK + t] = prm_t[size_t(i) * kNK + size_t(cnt - 1)];
      continue;
    }
    const uint8_t* v = k + size_t(j + static_cast<int>(t)) * stride;
    PrefetchAhead(k, j + static_cast<int>(t), n_end, stride, vb);
    F16ToF32(v, P * nb, prm);
    for (int i = 0; i < P * nb; ++i) prm_t[size_t(i) * kNK + t] = prm[i];
    float* HWY_RESTRICT out = rows + t * D;
    DecodeCodes<kQ>(v + hdr, D, out);
    row_ptr[t] = reinterpret_cast<const uint8_t*>(out);
  }
  size_t col = 0;
  for (; col + kNK <= D; col += kNK) TransposeColumns<KvQuant::F32, false>(row_ptr, col, kNK, kt);
  if (col < D) TransposeColumns<KvQuant::F32, true>(row_ptr, col, D - col, kt);
}

// acc_g of lane i (the x_i of the tree) for the G queries; qs_g: query g's BlockSumsQ.
template <KvQuant kQ, int G>
HWY_INLINE void QuantLaneG(const float* HWY_RESTRICT q0, const float* HWY_RESTRICT q1, const float* HWY_RESTRICT q2,
                           const float* HWY_RESTRICT q3, const float* const* HWY_RESTRICT qs,
                           const float* HWY_RESTRICT kt, const float* HWY_RESTRICT prm_t, size_t D, size_t i,
                           VK& a0, VK& a1, VK& a2, VK& a3) {
  constexpr int P = params_per_block(kQ);
  const DK dk;
  a0 = a1 = a2 = a3 = hn::Zero(dk);
  const int nb = n_blocks(static_cast<int>(D));
  for (int b = 0; b < nb; ++b) {
    const size_t e0 = size_t(b) * kKvBlock, e1 = std::min(D, e0 + kKvBlock);
    VK t0 = hn::Zero(dk), t1 = t0, t2 = t0, t3 = t0;
    for (size_t e = e0 + i; e < e1; e += 8) {
      const VK col = hn::Load(dk, kt + e * kNK);
#define TOWERS_KV_FMA(g) \
  if constexpr (G > g) t##g = hn::MulAdd(hn::Set(dk, q##g[e]), col, t##g);
      TOWERS_KV_G4(TOWERS_KV_FMA)
#undef TOWERS_KV_FMA
    }
    const VK d = hn::Load(dk, prm_t + size_t(P * b) * kNK);
#define TOWERS_KV_SCALE(g) \
  if constexpr (G > g) a##g = hn::MulAdd(d, t##g, a##g);
    TOWERS_KV_G4(TOWERS_KV_SCALE)
#undef TOWERS_KV_SCALE
    if constexpr (P == 2) {
      const VK m = hn::Load(dk, prm_t + size_t(2 * b + 1) * kNK);
#define TOWERS_KV_MIN(g) \
  if constexpr (G > g) a##g = hn::MulAdd(m, hn::Set(dk, qs[g][8 * b + i]), a##g);
      TOWERS_KV_G4(TOWERS_KV_MIN)
#undef TOWERS_KV_MIN
    }
  }
}

template <KvQuant kQ, int G>
HWY_NOINLINE void QuantScoresG(const float* const* HWY_RESTRICT qp, const float* const* HWY_RESTRICT qs,
                               const float* HWY_RESTRICT kt, const float* HWY_RESTRICT prm_t, size_t D,
                               float* const* HWY_RESTRICT sp, int j, int cnt) {
  const float* HWY_RESTRICT q0 = qp[0];
  const float* HWY_RESTRICT q1 = qp[G > 1 ? 1 : 0];
  const float* HWY_RESTRICT q2 = qp[G > 2 ? 2 : 0];
  const float* HWY_RESTRICT q3 = qp[G > 3 ? 3 : 0];
  VK x0, x1, x2, x3, y0, y1, y2, y3, u0, u1, u2, u3, w0, w1, w2, w3;
#define TOWERS_KV_LANE(i, a, b, c, d) QuantLaneG<kQ, G>(q0, q1, q2, q3, qs, kt, prm_t, D, i, a, b, c, d)
  // u = (x0 + x4) + (x2 + x6), w = (x1 + x5) + (x3 + x7): SumOfLanes's tree
  TOWERS_KV_LANE(0, x0, x1, x2, x3);
  TOWERS_KV_LANE(4, y0, y1, y2, y3);
#define TOWERS_KV_U(g) \
  if constexpr (G > g) u##g = hn::Add(x##g, y##g);
  TOWERS_KV_G4(TOWERS_KV_U)
#undef TOWERS_KV_U
  TOWERS_KV_LANE(2, x0, x1, x2, x3);
  TOWERS_KV_LANE(6, y0, y1, y2, y3);
#define TOWERS_KV_U(g) \
  if constexpr (G > g) u##g = hn::Add(u##g, hn::Add(x##g, y##g));
  TOWERS_KV_G4(TOWERS_KV_U)
#undef TOWERS_KV_U
  TOWERS_KV_LANE(1, x0, x1, x2, x3);
  TOWERS_KV_LANE(5, y0, y1, y2, y3);
#define TOWERS_KV_W(g) \
  if constexpr (G > g) w##g = hn::Add(x##g, y##g);
  TOWERS_KV_G4(TOWERS_KV_W)
#undef TOWERS_KV_W
  TOWERS_KV_LANE(3, x0, x1, x2, x3);
  TOWERS_KV_LANE(7, y0, y1, y2, y3);
#undef TOWERS_KV_LANE
#define TOWERS_KV_OUT(g) \
  if constexpr (G > g) StoreScores(hn::Add(u##g, hn::Add(w##g, hn::Add(x##g, y##g))), sp[g] + j, cnt);
  TOWERS_KV_G4(TOWERS_KV_OUT)
#undef TOWERS_KV_OUT
}

// kv_dot_group for Q8/Q6/Q4 with keys in lanes, in passes of up to kMaxQueriesPerBlock queries.
constexpr int kMaxQueriesPerBlock = 64;
template <KvQuant kQ>
HWY_NOINLINE void DotQuantKeysInLanes(const float* HWY_RESTRICT qv, int n_q, const uint8_t* HWY_RESTRICT k,
                                      size_t stride, int n, int n_ahead, int dim, float* HWY_RESTRICT scores,
                                      size_t score_stride) {
  HWY_ALIGN float kt[kKvMaxDim * kNK];
  HWY_ALIGN float rows[kKvMaxDim * kNK];
  HWY_ALIGN float prm_t[2 * kMaxBlocks * kNK];
  HWY_ALIGN float qsum[kMaxQueriesPerBlock][kMaxBlocks * 8];
  const size_t D = static_cast<size_t>(dim);
  for (int c0 = 0; c0 < n_q; c0 += kMaxQueriesPerBlock) {
    const int nc = std::min(kMaxQueriesPerBlock, n_q - c0);
    if constexpr (params_per_block(kQ) == 2) {
      for (int g = 0; g < nc; ++g) BlockSumsQ(qv + size_t(c0 + g) * D, D, qsum[g]);
    }
    for (int j = 0; j < n; j += static_cast<int>(kNK)) {
      const int cnt = std::min(static_cast<int>(kNK), n - j);
      TransposeQuantKeys<kQ>(k, stride, j, cnt, n + n_ahead, D, rows, kt, prm_t);
      for (int g0 = 0; g0 < nc; g0 += kQueriesPerPass) {
        const int G = std::min(kQueriesPerPass, nc - g0);
        const float* qp[4];
        const float* qs[4];
        float* sp[4];
        for (int g = 0; g < G; ++g) {
          qp[g] = qv + size_t(c0 + g0 + g) * D;
          qs[g] = qsum[g0 + g];
          sp[g] = scores + size_t(c0 + g0 + g) * score_stride;
        }
        switch (G) {
          case 4: QuantScoresG<kQ, 4>(qp, qs, kt, prm_t, D, sp, j, cnt); break;
          case 3: QuantScoresG<kQ, 3>(qp, qs, kt, prm_t, D, sp, j, cnt); break;
          case 2: QuantScoresG<kQ, 2>(qp, qs, kt, prm_t, D, sp, j, cnt); break;
          default: QuantScoresG<kQ, 1>(qp, qs, kt, prm_t, D, sp, j, cnt); break;
        }
      }
    }
  }
}
#endif  // keys in lanes

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define TOWERS_KV_WIDE_SUMS 1
// Elements [e0, e0 + 16 NV) of the G queries' sums over vectors [0, n), 16 lanes. The pass over the
// first elements prefetches the vectors ahead (below n_end).
template <KvQuant kQ, int NV, int G>
HWY_INLINE void AccWideG(const float* const* HWY_RESTRICT pp, const uint8_t* HWY_RESTRICT v, size_t stride, int n,
                         int n_end, size_t vb, size_t e0, float* const* HWY_RESTRICT ap) {
  const DK dk;
  const float* HWY_RESTRICT p0 = pp[0];
  const float* HWY_RESTRICT p1 = pp[G > 1 ? 1 : 0];
  const float* HWY_RESTRICT p2 = pp[G > 2 ? 2 : 0];
  const float* HWY_RESTRICT p3 = pp[G > 3 ? 3 : 0];
  float* HWY_RESTRICT acc0 = ap[0];
  float* HWY_RESTRICT acc1 = ap[G > 1 ? 1 : 0];
  float* HWY_RESTRICT acc2 = ap[G > 2 ? 2 : 0];
  float* HWY_RESTRICT acc3 = ap[G > 3 ? 3 : 0];
  const VK z = hn::Zero(dk);
  // a<g><k>: query g, elements e0 + 16k ..
#define TOWERS_KV_ON(g, k) (G > g && NV > k)
#define TOWERS_KV_LD(g, k) \
  VK a##g##k = z;          \
  if constexpr (TOWERS_KV_ON(g, k)) a##g##k = hn::LoadU(dk, acc##g + e0 + 16 * k);
#define TOWERS_KV_EACH(X, g) X(g, 0) X(g, 1) X(g, 2) X(g, 3)
#define TOWERS_KV_ALL(X) TOWERS_KV_EACH(X, 0) TOWERS_KV_EACH(X, 1) TOWERS_KV_EACH(X, 2) TOWERS_KV_EACH(X, 3)
  TOWERS_KV_ALL(TOWERS_KV_LD)
#undef TOWERS_KV_LD
  for (int j = 0; j < n; ++j) {
    const uint8_t* HWY_RESTRICT row = v + size_t(j) * stride;
    if (e0 == 0) PrefetchAhead(v, j, n_end, stride, vb);
    VK x0 = z, x1 = z, x2 = z, x3 = z;
    x0 = LoadWide<kQ, false>(row, e0);
    if constexpr (NV > 1) x1 = LoadWide<kQ, false>(row, e0 + 16);
    if constexpr (NV > 2) x2 = LoadWide<kQ, false>(row, e0 + 32);
    if constexpr (NV > 3) x3 = LoadWide<kQ, false>(row, e0 + 48);
#define TOWERS_KV_UPD(g, k) \
  if constexpr (TOWERS_KV_ON(g, k)) a##g##k = hn::MulAdd(w, x##k, a##g##k);
#define TOWERS_KV_HEAD(g)                \
  if constexpr (G > g) {                 \
    const VK w = hn::Set(dk, p##g[j]);   \
    TOWERS_KV_EACH(TOWERS_KV_UPD, g)     \
  }
    TOWERS_KV_G4(TOWERS_KV_HEAD)
#undef TOWERS_KV_HEAD
#undef TOWERS_KV_UPD
  }
#define TOWERS_KV_ST(g, k) \
  if constexpr (TOWERS_KV_ON(g, k)) hn::StoreU(a##g##k, dk, acc##g + e0 + 16 * k);
  TOWERS_KV_ALL(TOWERS_KV_ST)
#undef TOWERS_KV_ST
#undef TOWERS_KV_ALL
#undef TOWERS_KV_EACH
#undef TOWERS_KV_ON
}

// AccumulateGroupT for F32/F16 in 16 lanes; a last 8 elements (dim % 16 == 8) by AccBlockG.
template <KvQuant kQ, int G>
HWY_INLINE void AccumulateWideG(const float* const* HWY_RESTRICT pp, const uint8_t* HWY_RESTRICT v, size_t stride,
                                int n, int n_ahead, int dim, float* const* HWY_RESTRICT ap) {
  const size_t D = static_cast<size_t>(dim), D16 = D / 16 * 16;
  const int n_end = n + n_ahead;
  const size_t vb = vec_bytes(kQ, dim);
  size_t e0 = 0;
  for (; e0 + 64 <= D16; e0 += 64) AccWideG<kQ, 4, G>(pp, v, stride, n, n_end, vb, e0, ap);
  switch ((D16 - e0) / 16) {
    case 3: AccWideG<kQ, 3, G>(pp, v, stride, n, n_end, vb, e0, ap); break;
    case 2: AccWideG<kQ, 2, G>(pp, v, stride, n, n_end, vb, e0, ap); break;
    case 1: AccWideG<kQ, 1, G>(pp, v, stride, n, n_end, vb, e0, ap); break;
    default: break;
  }
  if (D16 < D) {  // elements D - 8 .. D - 1: group NG - 1 of the last block
    const size_t b0 = (D - 1) / kKvBlock * kKvBlock;
    if (D - b0 == 24) {
      AccBlockG<kQ, 3, 2, 3, G>(pp, 1, v, stride, 0, n, 0, D, b0, 0, ap);
    } else {
      AccBlockG<kQ, 1, 0, 1, G>(pp, 1, v, stride, 0, n, 0, D, b0, 0, ap);
    }
  }
}

// AccumulateGroupQ for F32/F16 and many queries: a chunk of vectors is first copied, as f32, to one
// contiguous buffer, then each group of four queries runs over the copy. In a KV cache a head's
// vectors are a whole row apart (2 KiB for Llama-3.2-1B's f32 rows): their cache lines fall in a few
// L1 sets, so a block of them does not stay in L1 between the groups of queries, where the copy does
// (and F16 is converted once, not once per group). Same operations on the same values: same bits.
constexpr size_t kStageFloats = 8192;
template <KvQuant kQ>
HWY_NOINLINE void AccumulateStaged(const float* p, size_t p_stride, int n_q, const uint8_t* HWY_RESTRICT v,
                                   size_t stride, int n, int n_ahead, int dim, float* acc) {
  HWY_ALIGN float vt[kStageFloats];
  const size_t D = static_cast<size_t>(dim), vb = vec_bytes(kQ, dim);
  const int rows = static_cast<int>(kStageFloats / D);
  for (int j0 = 0; j0 < n; j0 += rows) {
    const int cnt = std::min(rows, n - j0);
    for (int j = 0; j < cnt; ++j) {
      const uint8_t* row = v + size_t(j0 + j) * stride;
      PrefetchAhead(v, j0 + j, n + n_ahead, stride, vb);
      if constexpr (kQ == KvQuant::F32) {
        std::memcpy(vt + size_t(j) * D, row, sizeof(float) * D);
      } else {
        F16ToF32(row, dim, vt + size_t(j) * D);
      }
    }
    const auto* staged = reinterpret_cast<const uint8_t*>(vt);
    for (int g0 = 0; g0 < n_q; g0 += 4) {
      const int G = std::min(4, n_q - g0);
      const float* pp[4];
      float* ap[4];
      for (int g = 0; g < G; ++g) {
        pp[g] = p + size_t(g0 + g) * p_stride + j0;
        ap[g] = acc + size_t(g0 + g) * D;
      }
      switch (G) {
        case 4: AccumulateWideG<KvQuant::F32, 4>(pp, staged, sizeof(float) * D, cnt, 0, dim, ap); break;
        case 3: AccumulateWideG<KvQuant::F32, 3>(pp, staged, sizeof(float) * D, cnt, 0, dim, ap); break;
        case 2: AccumulateWideG<KvQuant::F32, 2>(pp, staged, sizeof(float) * D, cnt, 0, dim, ap); break;
        default: AccumulateWideG<KvQuant::F32, 1>(pp, staged, sizeof(float) * D, cnt, 0, dim, ap); break;
      }
    }
  }
}

// Staged sums of Q8/Q6/Q4 vectors: the chunk's codes are decoded once, as f32, with their
// parameters; per group of queries the weights are the 8-lane kernels' products w = p_j * d_b (and
// p_j * m_b), and each element gets acc = fma(w, c, acc) (Q8) or acc + fma(w_d, c, w_m) (Q6/Q4), in
// 16 lanes: the same operations per element, so the same bits.
constexpr size_t kStageParams = 2048;  // rows * params per vector, at most 2048 (dim 8) for any dim

// Elements [e0, e0 + 16 NV) (e0 a multiple of 64) of the G queries over the n staged vectors; vectors
// k and k + 1 of the 64 share the block e0 / 32 + k / 2. w_g: query g's weights, kw per vector.
template <KvQuant kQ, int NV, int G>
HWY_INLINE void AccWideQG(const float* const* HWY_RESTRICT wp, size_t kw, const float* HWY_RESTRICT codes,
                          size_t D, int n, size_t e0, float* const* HWY_RESTRICT ap) {
  constexpr int P = params_per_block(kQ);
  const DK dk;
  const size_t b0 = e0 / kKvBlock;
  float* HWY_RESTRICT acc0 = ap[0];
  float* HWY_RESTRICT acc1 = ap[G > 1 ? 1 : 0];
  float* HWY_RESTRICT acc2 = ap[G > 2 ? 2 : 0];
  float* HWY_RESTRICT acc3 = ap[G > 3 ? 3 : 0];
  const VK z = hn::Zero(dk);
#define TOWERS_KV_ON(g, k) (G > g && NV > k)
#define TOWERS_KV_LD(g, k) \
  VK a##g##k = z;          \
  if constexpr (TOWERS_KV_ON(g, k)) a##g##k = hn::LoadU(dk, acc##g + e0 + 16 * k);
#define TOWERS_KV_EACH(X, g) X(g, 0) X(g, 1) X(g, 2) X(g, 3)
#define TOWERS_KV_ALL(X) TOWERS_KV_EACH(X, 0) TOWERS_KV_EACH(X, 1) TOWERS_KV_EACH(X, 2) TOWERS_KV_EACH(X, 3)
  TOWERS_KV_ALL(TOWERS_KV_LD)
#undef TOWERS_KV_LD
  for (int j = 0; j < n; ++j) {
    const float* HWY_RESTRICT row = codes + size_t(j) * D + e0;
    VK x0 = z, x1 = z, x2 = z, x3 = z;
    x0 = hn::LoadU(dk, row);
    if constexpr (NV > 1) x1 = hn::LoadU(dk, row + 16);
    if constexpr (NV > 2) x2 = hn::LoadU(dk, row + 32);
    if constexpr (NV > 3) x3 = hn::LoadU(dk, row + 48);
    // ws<h>, wm<h>: the weights of block b0 + h (h = k / 2).
#define TOWERS_KV_UPD(g, k)                                                     \
  if constexpr (TOWERS_KV_ON(g, k)) {                                           \
    if constexpr (P == 2) {                                                     \
      a##g##k = hn::Add(a##g##k, hn::MulAdd(k < 2 ? ws0 : ws1, x##k, k < 2 ? wm0 : wm1)); \
    } else {                                                                    \
      a##g##k = hn::MulAdd(k < 2 ? ws0 : ws1, x##k, a##g##k);                   \
    }                                                                           \
  }
#define TOWERS_KV_HEAD(g)                                                                 \
  if constexpr (G > g) {                                                                  \
    const float* HWY_RESTRICT wj = wp[g] + size_t(j) * kw + P * b0;                       \
    const VK ws0 = hn::Set(dk, wj[0]);                                                    \
    const VK ws1 = NV > 2 ? hn::Set(dk, wj[P]) : ws0;                                     \
    const VK wm0 = P == 2 ? hn::Set(dk, wj[1]) : z;                                       \
    const VK wm1 = P == 2 && NV > 2 ? hn::Set(dk, wj[P + 1]) : z;                         \
    (void)wm0;                                                                            \
    (void)wm1;                                                                            \
    TOWERS_KV_EACH(TOWERS_KV_UPD, g)                                                      \
  }
    TOWERS_KV_G4(TOWERS_KV_HEAD)
#undef TOWERS_KV_HEAD
#undef TOWERS_KV_UPD
  }
#define TOWERS_KV_ST(g, k) \
  if constexpr (TOWERS_KV_ON(g, k)) hn::StoreU(a##g##k, dk, acc##g + e0 + 16 * k);
  TOWERS_KV_ALL(TOWERS_KV_ST)
#undef TOWERS_KV_ST
#undef TOWERS_KV_ALL
#undef TOWERS_KV_EACH
#undef TOWERS_KV_ON
}

// The last 8 elements (dim % 16 == 8) of the G queries over the n staged vectors, 8 lanes.
template <KvQuant kQ, int G>
HWY_INLINE void AccTailQG(const float* const* HWY_RESTRICT wp, size_t kw, const float* HWY_RESTRICT codes, size_t D,
                          int n, float* const* HWY_RESTRICT ap) {
  constexpr int P = params_per_block(kQ);
  const DF df;
  const size_t e = D - 8, b = e / kKvBlock;
  for (int g = 0; g < G; ++g) {
    VF a = hn::LoadU(df, ap[g] + e);
    for (int j = 0; j < n; ++j) {
      const VF x = hn::LoadU(df, codes + size_t(j) * D + e);
      const float* HWY_RESTRICT wj = wp[g] + size_t(j) * kw + P * b;
      if constexpr (P == 2) {
        a = hn::Add(a, hn::MulAdd(hn::Set(df, wj[0]), x, hn::Set(df, wj[1])));
      } else {
        a = hn::MulAdd(hn::Set(df, wj[0]), x, a);
      }
    }
    hn::StoreU(a, df, ap[g] + e);
  }
}

template <KvQuant kQ, int G>
HWY_INLINE void AccStagedQG(const float* const* wp, size_t kw, const float* codes, size_t D, int n,
                            float* const* ap) {
  const size_t D16 = D / 16 * 16;
  size_t e0 = 0;
  for (; e0 + 64 <= D16; e0 += 64) AccWideQG<kQ, 4, G>(wp, kw, codes, D, n, e0, ap);
  switch ((D16 - e0) / 16) {
    case 3: AccWideQG<kQ, 3, G>(wp, kw, codes, D, n, e0, ap); break;
    case 2: AccWideQG<kQ, 2, G>(wp, kw, codes, D, n, e0, ap); break;
    case 1: AccWideQG<kQ, 1, G>(wp, kw, codes, D, n, e0, ap); break;
    default: break;
  }
  if (D16 < D) AccTailQG<kQ, G>(wp, kw, codes, D, n, ap);
}

template <KvQuant kQ>
HWY_NOINLINE void AccumulateStagedQ(const float* p, size_t p_stride, int n_q, const uint8_t* HWY_RESTRICT v,
                                    size_t stride, int n, int n_ahead, int dim, float* acc) {
  constexpr int P = params_per_block(kQ);
  HWY_ALIGN float codes[kStageFloats];
  HWY_ALIGN float prm[kStageParams];
  HWY_ALIGN float w[4][kStageParams];
  const size_t D = static_cast<size_t>(dim), vb = vec_bytes(kQ, dim), hdr = header_bytes(kQ, dim);
  const size_t kw = size_t(P * n_blocks(dim));
  const int rows = static_cast<int>(std::min(kStageFloats / D, kStageParams / kw));
  for (int j0 = 0; j0 < n; j0 += rows) {
    const int cnt = std::min(rows, n - j0);
    for (int j = 0; j < cnt; ++j) {
      const uint8_t* row = v + size_t(j0 + j) * stride;
      PrefetchAhead(v, j0 + j, n + n_ahead, stride, vb);
      F16ToF32(row, static_cast<int>(kw), prm + size_t(j) * kw);
      DecodeCodes<kQ>(row + hdr, D, codes + size_t(j) * D);
    }
    for (int g0 = 0; g0 < n_q; g0 += 4) {
      const int G = std::min(4, n_q - g0);
      const float* wp[4];
      float* ap[4];
      for (int g = 0; g < G; ++g) {
        const float* pg = p + size_t(g0 + g) * p_stride + j0;
        for (int j = 0; j < cnt; ++j) {
          for (size_t i = 0; i < kw; ++i) w[g][size_t(j) * kw + i] = pg[j] * prm[size_t(j) * kw + i];
        }
        wp[g] = w[g];
        ap[g] = acc + size_t(g0 + g) * D;
      }
      switch (G) {
        case 4: AccStagedQG<kQ, 4>(wp, kw, codes, D, cnt, ap); break;
        case 3: AccStagedQG<kQ, 3>(wp, kw, codes, D, cnt, ap); break;
        case 2: AccStagedQG<kQ, 2>(wp, kw, codes, D, cnt, ap); break;
        default: AccStagedQG<kQ, 1>(wp, kw, codes, D, cnt, ap); break;
      }
    }
  }
}
#endif  // wide sums

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
    if constexpr (kQ == KvQuant::F32 || kQ == KvQuant::F16) {
      AccumulateStaged<kQ>(p, p_stride, n_q, v, stride, n, n_ahead, dim, acc);
    } else {
      AccumulateStagedQ<kQ>(p, p_stride, n_q, v, stride, n, n_ahead, dim, acc);
    }
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
