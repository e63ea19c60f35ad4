// Quantized weights (ggml block formats) times quantized activations: integer dot products per block,
// scaled and accumulated in f32. Dispatched at run time to the best Highway target of this CPU.
//
// Weight types (GGUF type ids): Q4_0=2, Q4_1=3, Q5_0=6, Q8_0=8, Q4_K=12, Q5_K=13, Q6_K=14, in ggml's
// exact block layouts.
//
// Activation rows are quantized by quantize_act into one of two layouts of our own (little-endian,
// n elements, the pointer aligned to 4 bytes at least; 64 is best):
//
//   A32 (for Q4_0, Q4_1, Q5_0, Q8_0 weights), nb = n / 32 blocks of 32:
//     int16_t q[n]      q = nearest_even(x * (127 / amax)) in [-127, 127] (int8 values stored widened
//                       to int16, so the kernels need not widen them for every weight row)
//     float   d[nb]     amax / 127 of the block (0 when amax < 1e-30: the block is all zeros)
//     float   ds[nb]    d * (sum of the block's q), used for Q4_1's min term
//   A256 (for Q4_K, Q5_K, Q6_K weights), nb = n / 256 blocks of 256:
//     int16_t q[n]      as above, amax taken over 256 elements
//     float   d[nb]
//     int16_t bsums[nb * 8]    sum of q over each run of 32 elements (the Q4_K/Q5_K sub-blocks)
//
// Dequantized activation element i is d[i / block] * q[i]. All K types share A256 and all legacy
// types share A32, so one quantize_act serves every weight matrix of the same family that reads
// the same input (e.g. Q4_K and Q6_K projections of one normed hidden state).
//
// Determinism: the value computed for one (weight row, activation row) pair does not depend on T, on
// which other rows are in the call, or on how a caller splits rows among threads: the per-pair
// sequence of operations is fixed (integer sums per block are exact; the f32 accumulation runs over
// the blocks in order). It does depend on the Highway target (lane count), like dot_f32.
#pragma once
#include <cstddef>
#include <cstdint>

namespace towers::simd {

// Bytes of one quantized activation row of n elements for this weight type (0 if unsupported).
size_t act_bytes(uint32_t weight_type, size_t n);
// Quantizes n floats (finite; n a multiple of the weight block size) into act (act_bytes bytes).
void quantize_act(uint32_t weight_type, const float* x, void* act, size_t n);
// True for Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K.
bool has_quant_dot(uint32_t weight_type);

// y[t * ldy + r] = dot(W row r, activation row t) for r in [0, rows), t in [0, T).
// w points at the first weight row (rows are row_stride bytes apart); act at activation row 0
// (rows act_stride >= act_bytes bytes apart, a multiple of 4). n is a multiple of the block size.
// Each weight block is unpacked once and applied to up to 4 activation rows at a time; with many
// activation rows the work is tiled so weights and activations stay in L2 (results are unchanged).
void gemm_q(uint32_t weight_type, const void* w, size_t row_stride, size_t rows, const void* act,
            size_t act_stride, size_t T, size_t n, float* y, size_t ldy);

}  // namespace towers::simd
