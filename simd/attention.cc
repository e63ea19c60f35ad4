#include "simd/attention.h"

#include "simd/int8_attention.h"
#include "simd/ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/attention.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace towers::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

void ExpF32(const float* HWY_RESTRICT x, float* y, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Exp(d, hn::LoadU(d, x + i)), d, y + i);
  if (i < n) {
    HWY_ALIGN float t[kMaxLanes] = {};
    std::memcpy(t, x + i, (n - i) * sizeof(float));
    hn::Store(hn::Exp(d, hn::Load(d, t)), d, t);
    std::memcpy(y + i, t, (n - i) * sizeof(float));
  }
}

// Two passes over the block (it is in L1): scaled max, then exp and sum. A last partial vector is
// padded with -inf, whose exp is 0, so every element goes through the same vector code.
HWY_INLINE float SoftmaxBlockImpl(const float* s, int n, float scale, float* m, float* l, float* p) {
  const DF d;
  const size_t N = hn::Lanes(d), un = static_cast<size_t>(n);
  const auto vscale = hn::Set(d, scale);
  auto vmax = hn::Set(d, -INFINITY);
  size_t j = 0;
  for (; j + N <= un; j += N) vmax = hn::Max(vmax, hn::Mul(hn::LoadU(d, s + j), vscale));
  const size_t rest = un - j;
  HWY_ALIGN float tail[kMaxLanes];
  auto vtail = hn::Set(d, -INFINITY);
  if (rest) {
    hn::Store(vtail, d, tail);
    std::memcpy(tail, s + j, rest * sizeof(float));
    vtail = hn::Mul(hn::Load(d, tail), vscale);
    vmax = hn::Max(vmax, vtail);
  }
  const float bmax = hn::GetLane(hn::MaxOfLanes(d, vmax));
  const float m_old = *m;
  float c = 1.0f, m_new = m_old;
  if (bmax > m_old) {
    m_new = bmax;
    c = hn::GetLane(hn::Exp(d, hn::Set(d, m_old - m_new)));  // 0 when m_old is -inf
  }
  const auto vm = hn::Set(d, m_new);
  auto sum = hn::Zero(d);
  for (j = 0; j + N <= un; j += N) {
    const auto e = hn::Exp(d, hn::Sub(hn::Mul(hn::LoadU(d, s + j), vscale), vm));
    hn::StoreU(e, d, p + j);
    sum = hn::Add(sum, e);
  }
  if (rest) {
    const auto e = hn::Exp(d, hn::Sub(vtail, vm));
    hn::Store(e, d, tail);
    std::memcpy(p + j, tail, rest * sizeof(float));
    sum = hn::Add(sum, e);
  }
  *l = *l * c + hn::GetLane(hn::SumOfLanes(d, sum));
  *m = m_new;
  return c;
}

float SoftmaxBlock(const float* s, int n, float scale, float* m, float* l, float* p) {
  return SoftmaxBlockImpl(s, n, scale, m, l, p);
}

// a[e] *= c for e < dim (a multiple of 8): the same product per element as a scalar loop.
HWY_INLINE void ScaleRow(float* HWY_RESTRICT a, int dim, float c) {
  const hn::CappedTag<float, 8> d8;
  const auto vc = hn::Set(d8, c);
  const int N = static_cast<int>(hn::Lanes(d8));
  for (int e = 0; e < dim; e += N) hn::StoreU(hn::Mul(hn::LoadU(d8, a + e), vc), d8, a + e);
}

// keys: nullptr for the exact scores, else the int8 key blocks of the rows; values likewise for the
// weighted sums (kv_attend_int8).
void KvAttend(KvQuant q, const float* qv, int n_q, const void* k, const void* v, size_t stride, int n, int dim,
              float scale, float* m, float* l, float* acc, float softcap, const Int8Keys* keys,
              const Int8Values* values) {
  // Queries per pass over a block (a prefill tile's 64): the kernels read or decode each K and V
  // vector once for all of them (the scores' keys-in-lanes path transposes a K block once for them).
  constexpr int kG = 64;
  static_assert(kG <= kInt8MaxQueries && kAttnBlock == kInt8MaxKeys, "int8 scores: a pass's queries, a block's keys");
  HWY_ALIGN float s[kG * kAttnBlock];
  const auto* kb = static_cast<const uint8_t*>(k);
  const auto* vb = static_cast<const uint8_t*>(v);
  thread_local std::vector<Int8Queries> int8_q;  // int8 scores: the queries, quantized once per call
  if (keys) {
    int8_q.resize(static_cast<size_t>((n_q + kG - 1) / kG));
    for (int g0 = 0; g0 < n_q; g0 += kG) {
      int8_queries(qv + size_t(g0) * dim, std::min(kG, n_q - g0), dim, &int8_q[static_cast<size_t>(g0 / kG)]);
    }
  }
  for (int j0 = 0; j0 < n; j0 += kAttnBlock) {
    const int nb = std::min(kAttnBlock, n - j0);
    const uint8_t* vj = vb + size_t(j0) * stride;
    for (int g0 = 0; g0 < n_q; g0 += kG) {
      const int G = std::min(kG, n_q - g0);
      if (keys) {
        int8_scores(int8_q[static_cast<size_t>(g0 / kG)], qv + size_t(g0) * dim, 0, G, keys[j0 / kAttnBlock], s,
                    kAttnBlock);
      } else {
        kv_dot_group(q, qv + size_t(g0) * dim, G, kb + size_t(j0) * stride, stride, nb, dim, s, kAttnBlock,
                     n - j0 - nb);
      }
      for (int g = 0; g < G; ++g) {
        float* sg = s + size_t(g) * kAttnBlock;
        float block_scale = scale;
        if (softcap > 0) {
          softcap_f32(sg, static_cast<size_t>(nb), scale, softcap);
          block_scale = 1.0f;
        }
        const float c = SoftmaxBlockImpl(sg, nb, block_scale, m + g0 + g, l + g0 + g, sg);
        if (c != 1.0f) ScaleRow(acc + size_t(g0 + g) * dim, dim, c);
      }
      if (values) {
        int8_accumulate(s, kAttnBlock, G, values[j0 / kAttnBlock], acc + size_t(g0) * dim);
      } else {
        kv_accumulate_group(q, s, kAttnBlock, G, vj, stride, nb, dim, acc + size_t(g0) * dim, n - j0 - nb);
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace towers::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace towers::simd {
HWY_EXPORT(ExpF32);
HWY_EXPORT(SoftmaxBlock);
HWY_EXPORT(KvAttend);

void exp_f32(const float* x, float* y, size_t n) { HWY_DYNAMIC_DISPATCH(ExpF32)(x, y, n); }

float softmax_block(const float* s, int n, float scale, float* m, float* l, float* p) {
  if (n <= 0) return 1.0f;
  return HWY_DYNAMIC_DISPATCH(SoftmaxBlock)(s, n, scale, m, l, p);
}

void kv_attend(KvQuant q, const float* qv, int n_q, const void* k, const void* v, size_t stride, int n, int dim,
               float scale, float* m, float* l, float* acc, float softcap) {
  if (!kv_quant_ok(q, dim) || n <= 0 || n_q <= 0) return;
  HWY_DYNAMIC_DISPATCH(KvAttend)(q, qv, n_q, k, v, stride, n, dim, scale, m, l, acc, softcap, nullptr, nullptr);
}

void kv_attend_int8(const Int8Keys* keys, const Int8Values* values, KvQuant q, const float* qv, int n_q, const void* v,
                    size_t stride, int n, int dim, float scale, float* m, float* l, float* acc, float softcap) {
  if (!kv_quant_ok(q, dim) || n <= 0 || n_q <= 0 || !int8_attention_available()) return;
  HWY_DYNAMIC_DISPATCH(KvAttend)(q, qv, n_q, nullptr, v, stride, n, dim, scale, m, l, acc, softcap, keys, values);
}
}  // namespace towers::simd
#endif
