// Attention over quantized KV vectors (simd/kv_quant.h) with an online (streaming) softmax, and the
// vectorised exp it uses.
//
// kv_attend is the inner loop of Forward::attention: the query heads that share one KV head (GQA) --
// in prefill those of a tile of consecutive tokens, so that each block serves all of them while it is
// in cache -- over the rows of one span of one KV head, in blocks of kAttnBlock rows counted from the
// span's first row. Per block it scores every query against the block (kv_dot_many), runs one online-softmax step
// per query (softmax_block: scale, block max, rescale, exp, sum, in two Highway passes over the
// L1-resident block) and adds the weighted values. Scores and value sums use the group kernels
// (kv_dot_group, kv_accumulate_group), given up to 64 queries at once (a prefill tile's): each K/V
// vector is read from memory and decoded once for all of them (on x86 a block of keys is transposed
// once for all of them), not once per query head, and the results are the bits kv_dot_many /
// kv_accumulate would give for each query alone.
//
// Determinism: a query's result depends only on that query, the rows and n, never on the other
// queries of the call or on the caller's threads (each query's state is updated by the same
// operations in the same order as a call with n_q = 1). Splitting a span's rows into consecutive
// calls at multiples of kAttnBlock gives the same bits as one call. Results depend on the Highway
// target (lane count), like every reduction in simd/ (docs/numerics.md).
#pragma once
#include <cstddef>

#include "simd/int8_attention.h"
#include "simd/kv_quant.h"

namespace towers::simd {

// Rows per online-softmax block.
inline constexpr int kAttnBlock = 128;

// y[i] = e^x[i]: Highway's Exp (max error 1 ulp in its documented range), 0 for x < -104 (including
// -inf) and for NaN, +inf above ~88.7. In-place (y == x) is allowed.
void exp_f32(const float* x, float* y, size_t n);

// One online-softmax step over a block of n >= 1 raw scores s (kv_attend passes kAttnBlock or fewer):
//   x[j] = s[j] * scale;  m' = max(*m, max_j x[j]);  p[j] = exp(x[j] - m');
//   *l = *l * c + sum_j p[j]  with  c = exp(*m - m')  (c = 1 exactly when the max did not grow,
//   0 when *m was -inf);  *m = m'.  Returns c (the caller rescales its value accumulator by it).
// The sum is taken in lanes then across them, in a fixed order for a target. p may alias s.
float softmax_block(const float* s, int n, float scale, float* m, float* l, float* p);

// For each query g < n_q (vector qv + g*dim): the online softmax over rows [0, n) of one KV head,
// K vector j at k + j*stride and V vector j at v + j*stride, both in format q, continued from the
// state m[g], l[g], acc[g*dim .. g*dim + dim) (start with -inf, 0, zeros; the attention output is
// acc / l after the last span). Does nothing when !kv_quant_ok(q, dim) or n <= 0.
// softcap > 0: every scaled score x becomes softcap * tanh(x / softcap) before the softmax (Gemma 2).
void kv_attend(KvQuant q, const float* qv, int n_q, const void* k, const void* v, size_t stride, int n, int dim,
               float scale, float* m, float* l, float* acc, float softcap = 0);

// kv_attend in int8 (simd/int8_attention.h; x86 AVX-512 VNNI, only when int8_attention_available()):
// block i of the rows, [i * kAttnBlock, min(n, (i + 1) * kAttnBlock)), is scored against keys[i] and,
// when values is not nullptr, summed from values[i] (else in f32 from v, as kv_attend does), which
// int8_keys / int8_values built from those rows of K and V (F32 or F16), so that a caller can build
// each block once for every tile that reads it. Another arithmetic than kv_attend's: a query's result
// depends only on that query, the blocks and the rows (not on the other queries of the call or the
// threads), but it is not kv_attend's, so steps that use it no longer give decode's bits and the
// codec never does (Forward::set_int8_attention).
void kv_attend_int8(const Int8Keys* keys, const Int8Values* values, KvQuant q, const float* qv, int n_q, const void* v,
                    size_t stride, int n, int dim, float scale, float* m, float* l, float* acc, float softcap = 0);

}  // namespace towers::simd
