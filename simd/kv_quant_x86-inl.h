// Part of simd/kv_quant.cc: its attention kernels on x86, for many queries per call (keys in lanes,
// staged sums) and F32/F16 sums in 16 lanes. Included by kv_quant.cc inside its per-target namespace,
// after the 8-lane kernels whose arithmetic these reproduce and whose helpers they use (DecodeBlock,
// BlockSumsQ, PrefetchAhead, AccBlockG); compiled once per Highway target, like the file around it.
// Defines TOWERS_KV_KEYS_IN_LANES (AVX2, AVX-512) and TOWERS_KV_WIDE_SUMS (AVX-512) for the targets
// that have these kernels; kv_quant.cc undefines them at the end of each target.
//
// The arithmetic of kv_quant.cc's 8-lane kernels, laid out for wide vectors. Every format for
// many queries per call (a prefill tile's 64 query heads: scores with keys in lanes, sums over a
// staged f32 copy of the vectors), and F32/F16 sums in 16 lanes for any number (AVX-512).
//
// Scores, keys in lanes. Per (query, key) kv_quant.cc's kernels run two chains of 8 lanes: lane i of
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
      const auto* h = reinterpret_cast<const hwy::float16_t*>(row);
      return hn::ZeroExtendVector(dk, hn::PromoteTo(dh, hn::LoadU(d16, h + e)));
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

// The scores s_g[j .. j + cnt) of the G queries from their lane sums: lane(i, x0, x1, x2, x3) gives
// x_i of each query (the 8-lane kernels' lane i before their SumOfLanes), and they are added as
// SumOfLanes adds them: ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)).
template <int G, class Lane>
HWY_INLINE void LanePairG(const Lane& lane, size_t a, size_t b, VK& s0, VK& s1, VK& s2, VK& s3) {
  VK y0, y1, y2, y3;
  lane(a, s0, s1, s2, s3);
  lane(b, y0, y1, y2, y3);
#define TOWERS_KV_ADD(g) \
  if constexpr (G > g) s##g = hn::Add(s##g, y##g);
  TOWERS_KV_G4(TOWERS_KV_ADD)
#undef TOWERS_KV_ADD
}

template <int G, class Lane>
HWY_INLINE void TreeScoresG(const Lane& lane, float* const* HWY_RESTRICT sp, int j, int cnt) {
  VK u0, u1, u2, u3, w0, w1, w2, w3, t0, t1, t2, t3;
  LanePairG<G>(lane, 0, 4, u0, u1, u2, u3);
  LanePairG<G>(lane, 2, 6, t0, t1, t2, t3);
#define TOWERS_KV_U(g) \
  if constexpr (G > g) u##g = hn::Add(u##g, t##g);
  TOWERS_KV_G4(TOWERS_KV_U)
#undef TOWERS_KV_U
  LanePairG<G>(lane, 1, 5, w0, w1, w2, w3);
  LanePairG<G>(lane, 3, 7, t0, t1, t2, t3);
#define TOWERS_KV_OUT(g) \
  if constexpr (G > g) StoreScores(hn::Add(u##g, hn::Add(w##g, t##g)), sp[g] + j, cnt);
  TOWERS_KV_G4(TOWERS_KV_OUT)
#undef TOWERS_KV_OUT
}

// Lane i of F32/F16 scores: PairG over the transposed block kt.
template <int G>
struct F32Lanes {
  const float* HWY_RESTRICT q0;
  const float* HWY_RESTRICT q1;
  const float* HWY_RESTRICT q2;
  const float* HWY_RESTRICT q3;
  const float* HWY_RESTRICT kt;
  size_t D16;
  bool tail;
  HWY_INLINE void operator()(size_t i, VK& x0, VK& x1, VK& x2, VK& x3) const {
    PairG<G>(q0, q1, q2, q3, kt, D16, tail, i, x0, x1, x2, x3);
  }
};

// s_g[j .. j + cnt) = the scores of the G queries against the transposed block kt.
template <int G>
HWY_NOINLINE void ScoresG(const float* const* HWY_RESTRICT qp, const float* HWY_RESTRICT kt, size_t D,
                          float* const* HWY_RESTRICT sp, int j, int cnt) {
  const size_t D16 = D / 16 * 16;
  const F32Lanes<G> lanes{qp[0], qp[G > 1 ? 1 : 0], qp[G > 2 ? 2 : 0], qp[G > 3 ? 3 : 0], kt, D16, D16 < D};
  TreeScoresG<G>(lanes, sp, j, cnt);
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

// Lane i of Q8/Q6/Q4 scores: QuantLaneG over the transposed block.
template <KvQuant kQ, int G>
struct QuantLanes {
  const float* HWY_RESTRICT q0;
  const float* HWY_RESTRICT q1;
  const float* HWY_RESTRICT q2;
  const float* HWY_RESTRICT q3;
  const float* const* HWY_RESTRICT qs;
  const float* HWY_RESTRICT kt;
  const float* HWY_RESTRICT prm_t;
  size_t D;
  HWY_INLINE void operator()(size_t i, VK& x0, VK& x1, VK& x2, VK& x3) const {
    QuantLaneG<kQ, G>(q0, q1, q2, q3, qs, kt, prm_t, D, i, x0, x1, x2, x3);
  }
};

template <KvQuant kQ, int G>
HWY_NOINLINE void QuantScoresG(const float* const* HWY_RESTRICT qp, const float* const* HWY_RESTRICT qs,
                               const float* HWY_RESTRICT kt, const float* HWY_RESTRICT prm_t, size_t D,
                               float* const* HWY_RESTRICT sp, int j, int cnt) {
  const QuantLanes<kQ, G> lanes{qp[0], qp[G > 1 ? 1 : 0], qp[G > 2 ? 2 : 0], qp[G > 3 ? 3 : 0], qs, kt, prm_t, D};
  TreeScoresG<G>(lanes, sp, j, cnt);
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
// Elements [e0, e0 + 16 NV) (e0 a multiple of 64) of the G queries' sums over vectors [0, n), 16
// lanes; vector j's elements are read as kLoad (F32, or F16 widened) at v + j * stride. The weights,
// as the 8-lane kernels compute them: kP == 0 (F32/F16) w = p_j = wp[g][j], acc = fma(w, x, acc);
// kP == 1 (Q8) w = p_j * d_b, acc = fma(w, c, acc); kP == 2 (Q6/Q4) acc + fma(p_j * d_b, c, p_j * m_b),
// the block's weights at wp[g] + j * kw + kP * b (vectors k and k + 1 of the 64 share block e0/32 + k/2).
template <KvQuant kLoad, int kP, int NV, int G>
HWY_INLINE void AccWide(const float* const* HWY_RESTRICT wp, size_t kw, const uint8_t* HWY_RESTRICT v,
                        size_t stride, int n, size_t e0, float* const* HWY_RESTRICT ap) {
  const DK dk;
  const size_t wb = kP == 0 ? 0 : kP * (e0 / kKvBlock);
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
    VK x0 = z, x1 = z, x2 = z, x3 = z;
    x0 = LoadWide<kLoad, false>(row, e0);
    if constexpr (NV > 1) x1 = LoadWide<kLoad, false>(row, e0 + 16);
    if constexpr (NV > 2) x2 = LoadWide<kLoad, false>(row, e0 + 32);
    if constexpr (NV > 3) x3 = LoadWide<kLoad, false>(row, e0 + 48);
    // ws<h>, wm<h>: the weights of the block of vectors 2h, 2h + 1.
#define TOWERS_KV_UPD(g, k)                                                                 \
  if constexpr (TOWERS_KV_ON(g, k)) {                                                       \
    if constexpr (kP == 2) {                                                                \
      a##g##k = hn::Add(a##g##k, hn::MulAdd(k < 2 ? ws0 : ws1, x##k, k < 2 ? wm0 : wm1));   \
    } else {                                                                                \
      a##g##k = hn::MulAdd(k < 2 ? ws0 : ws1, x##k, a##g##k);                               \
    }                                                                                       \
  }
#define TOWERS_KV_HEAD(g)                                                                      \
  if constexpr (G > g) {                                                                       \
    const float* HWY_RESTRICT wj = wp[g] + (kP == 0 ? size_t(j) : size_t(j) * kw + wb);        \
    const VK ws0 = hn::Set(dk, wj[0]);                                                         \
    const VK ws1 = kP > 0 && NV > 2 ? hn::Set(dk, wj[kP]) : ws0;                               \
    const VK wm0 = kP == 2 ? hn::Set(dk, wj[1]) : z;                                           \
    const VK wm1 = kP == 2 && NV > 2 ? hn::Set(dk, wj[kP + 1]) : z;                            \
    (void)wm0;                                                                                 \
    (void)wm1;                                                                                 \
    TOWERS_KV_EACH(TOWERS_KV_UPD, g)                                                           \
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

// AccumulateGroupT for F32/F16 in 16 lanes, chunks of kChunk vectors; a last 8 elements (dim % 16
// == 8) by AccBlockG.
template <KvQuant kQ, int G>
HWY_INLINE void AccumulateWideG(const float* const* HWY_RESTRICT pp, const uint8_t* HWY_RESTRICT v, size_t stride,
                                int n, int n_ahead, int dim, float* const* HWY_RESTRICT ap) {
  const size_t D = static_cast<size_t>(dim), D16 = D / 16 * 16;
  const size_t vb = vec_bytes(kQ, dim);
  for (int j0 = 0; j0 < n; j0 += kChunk) {  // a chunk's vectors stay in cache for all its elements
    const int cnt = std::min(kChunk, n - j0), n_end = n + n_ahead - j0;
    const uint8_t* HWY_RESTRICT vj = v + size_t(j0) * stride;
    const float* pj[4];
    for (int g = 0; g < G; ++g) pj[g] = pp[g] + j0;
    // The chunk's vectors are asked for before its sums start, as AccumulateGroupT does: from DRAM (a
    // long context) a prefetch a few vectors ahead of the sums comes too late.
    for (int j = 0; j < cnt; ++j) PrefetchAhead(vj, j, n_end, stride, vb);
    size_t e0 = 0;
    for (; e0 + 64 <= D16; e0 += 64) AccWide<kQ, 0, 4, G>(pj, 1, vj, stride, cnt, e0, ap);
    switch ((D16 - e0) / 16) {
      case 3: AccWide<kQ, 0, 3, G>(pj, 1, vj, stride, cnt, e0, ap); break;
      case 2: AccWide<kQ, 0, 2, G>(pj, 1, vj, stride, cnt, e0, ap); break;
      case 1: AccWide<kQ, 0, 1, G>(pj, 1, vj, stride, cnt, e0, ap); break;
      default: break;
    }
    if (D16 < D) {  // elements D - 8 .. D - 1: group NG - 1 of the last block
      const size_t b0 = (D - 1) / kKvBlock * kKvBlock;
      if (D - b0 == 24) {
        AccBlockG<kQ, 3, 2, 3, G>(pj, 1, vj, stride, 0, cnt, 0, D, b0, 0, ap);
      } else {
        AccBlockG<kQ, 1, 0, 1, G>(pj, 1, vj, stride, 0, cnt, 0, D, b0, 0, ap);
      }
    }
  }
}

// AccumulateGroupQ for many queries: a chunk of vectors is first staged as f32 in one contiguous
// buffer (F32 copied, F16 widened, Q8/Q6/Q4 codes decoded, with their parameters), then each group of
// four queries runs over the copy, while the next chunk's vectors (or the caller's next rows) are
// fetched: the copy itself is too quick to hide DRAM. In a KV cache a head's vectors are a whole row
// apart (2 KiB for Llama-3.2-1B's f32 rows): their cache lines fall in a few L1 sets, so a block of
// them does not stay in L1 between the groups of queries, where the copy does (and a vector is
// converted or decoded once, not once per group). The weights are the 8-lane kernels': p_j itself
// (F32/F16), or its products with the block's d_b and m_b; each element then gets the 8-lane kernels'
// operations in 16 lanes (AccWide), so the same bits.
constexpr size_t kStageFloats = 8192;
constexpr size_t kStageParams = 2048;  // rows * params per vector, at most 2048 (dim 8) for any dim

// The last 8 elements (dim % 16 == 8) of the G queries over the n staged vectors, 8 lanes.
template <KvQuant kQ, int G>
HWY_INLINE void AccTailG(const float* const* HWY_RESTRICT wp, size_t kw, const float* HWY_RESTRICT codes, size_t D,
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

// The G queries' sums over the n staged vectors; w_g: query g's weights, kw per vector.
template <KvQuant kQ, int G>
HWY_INLINE void AccStagedG(const float* const* wp, size_t kw, const float* codes, size_t D, int n,
                           float* const* ap) {
  constexpr int P = params_per_block(kQ);
  const auto* rows = reinterpret_cast<const uint8_t*>(codes);
  const size_t D16 = D / 16 * 16;
  size_t e0 = 0;
  for (; e0 + 64 <= D16; e0 += 64) AccWide<KvQuant::F32, P, 4, G>(wp, kw, rows, sizeof(float) * D, n, e0, ap);
  switch ((D16 - e0) / 16) {
    case 3: AccWide<KvQuant::F32, P, 3, G>(wp, kw, rows, sizeof(float) * D, n, e0, ap); break;
    case 2: AccWide<KvQuant::F32, P, 2, G>(wp, kw, rows, sizeof(float) * D, n, e0, ap); break;
    case 1: AccWide<KvQuant::F32, P, 1, G>(wp, kw, rows, sizeof(float) * D, n, e0, ap); break;
    default: break;
  }
  if (D16 < D) AccTailG<kQ, G>(wp, kw, codes, D, n, ap);
}

template <KvQuant kQ>
HWY_NOINLINE void AccumulateStaged(const float* p, size_t p_stride, int n_q, const uint8_t* HWY_RESTRICT v,
                                   size_t stride, int n, int n_ahead, int dim, float* acc) {
  constexpr int P = params_per_block(kQ);
  HWY_ALIGN float codes[kStageFloats];
  HWY_ALIGN float prm[P == 0 ? 1 : kStageParams];
  HWY_ALIGN float w[4][P == 0 ? 1 : kStageParams];
  const size_t D = static_cast<size_t>(dim), vb = vec_bytes(kQ, dim), hdr = header_bytes(kQ, dim);
  const size_t kw = P == 0 ? 1 : size_t(P * n_blocks(dim));
  const int rows = static_cast<int>(P == 0 ? kStageFloats / D : std::min(kStageFloats / D, kStageParams / kw));
  for (int j0 = 0; j0 < n; j0 += rows) {
    const int cnt = std::min(rows, n - j0);
    for (int j = 0; j < cnt; ++j) {
      const uint8_t* row = v + size_t(j0 + j) * stride;
      float* out = codes + size_t(j) * D;
      PrefetchAhead(v, j0 + j, n + n_ahead, stride, vb);
      if constexpr (kQ == KvQuant::F32) {
        std::memcpy(out, row, sizeof(float) * D);
      } else if constexpr (kQ == KvQuant::F16) {
        F16ToF32(row, dim, out);
      } else {
        F16ToF32(row, static_cast<int>(kw), prm + size_t(j) * kw);
        DecodeCodes<kQ>(row + hdr, D, out);
      }
    }
    PrefetchRows(v, j0 + cnt, std::min(j0 + cnt + rows, n + n_ahead), stride, vb);
    for (int g0 = 0; g0 < n_q; g0 += 4) {
      const int G = std::min(4, n_q - g0);
      const float* wp[4];
      float* ap[4];
      for (int g = 0; g < G; ++g) {
        const float* pg = p + size_t(g0 + g) * p_stride + j0;
        if constexpr (P == 0) {
          wp[g] = pg;
        } else {
          for (int j = 0; j < cnt; ++j) {
            for (size_t i = 0; i < kw; ++i) w[g][size_t(j) * kw + i] = pg[j] * prm[size_t(j) * kw + i];
          }
          wp[g] = w[g];
        }
        ap[g] = acc + size_t(g0 + g) * D;
      }
      switch (G) {
        case 4: AccStagedG<kQ, 4>(wp, kw, codes, D, cnt, ap); break;
        case 3: AccStagedG<kQ, 3>(wp, kw, codes, D, cnt, ap); break;
        case 2: AccStagedG<kQ, 2>(wp, kw, codes, D, cnt, ap); break;
        default: AccStagedG<kQ, 1>(wp, kw, codes, D, cnt, ap); break;
      }
    }
  }
}
#endif  // wide sums
