// Quantized weights (ggml block formats) times quantized activations: integer dot products per block,
// scaled and accumulated in f32. Dispatched at run time to the best Highway target of this CPU.
// Implemented by quant_act.cc (quantize_act), gemm_q.cc (with gemm_q_lowbit-inl.h), pack_rows.cc
// and gemm_packed.cc (with its VNNI path in gemm_packed_vnni-inl.h); the ggml blocks are
// simd/ggml_blocks.h.
//
// Weight types (GGUF type ids): Q4_0=2, Q4_1=3, Q5_0=6, Q5_1=7, Q8_0=8, Q2_K=10, Q3_K=11, Q4_K=12,
// Q5_K=13, Q6_K=14, IQ4_NL=20, IQ4_XS=23, in ggml's exact block layouts.
//
// Activation rows are quantized by quantize_act into one of two layouts of our own (little-endian,
// n elements, the pointer aligned to 4 bytes at least; 64 is best):
//
//   A32 (for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL weights), nb = n / 32 blocks of 32:
//     int16_t q[n]      q = nearest_even(x * (127 / amax)) in [-127, 127] (int8 values stored widened
//                       to int16, so the kernels need not widen them for every weight row)
//     float   d[nb]     amax / 127 of the block (0 when amax < 1e-30: the block is all zeros)
//     float   ds[nb]    d * (sum of the block's q), used for Q4_1's and Q5_1's min term
//                       (ActScales::F16, the default: both rounded to f16 after they are computed in
//                       f32, the values ggml's block_q8_0 / block_q8_1 hold, except outside f16's normal
//                       range [2^-14, 65504], where ggml's would be lost and the f32 value stays;
//                       ActScales::F32: as computed)
//     int32_t s[nb]     sum of the block's q (exact), used by the packed Q4_0 (-8) and Q8_0 (VNNI:
//                       -128) offsets
//     int8_t  q8[n]     the same q as int8 (the packed VNNI kernels' signed operand)
//   A256 (for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS weights), nb = n / 256 blocks of 256:
//     int16_t q[n]      as above, amax taken over 256 elements
//     float   d[nb]
//     int16_t bsums[nb * 8]    sum of q over each run of 32 elements (the Q4_K/Q5_K sub-blocks)
//     int8_t  q8[n]     the same q as int8
//     int16_t bs16[nb * 16]    sum of q over each run of 16 elements (the Q6_K scale groups, VNNI;
//                       Q2_K's min term)
// (q8 starts at a multiple of 4 bytes from the row: 2n + 12 nb, resp. 2n + 20 nb.)
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

// How A32 rows keep their block scales. F16: rounded to f16 as ggml's Q8_0 / Q8_1 activation blocks
// store them, so our logits on the 32-element types follow llama.cpp's (docs/numerics.md). F32: the
// unrounded values, the arithmetic of Towers before 2026-11-27; kept because the cold tier's coded
// records carry the arithmetic they were coded with (docs/codec.md, store header flags).
enum class ActScales : uint8_t { F16, F32 };

// Bytes of one quantized activation row of n elements for this weight type (0 if unsupported).
size_t act_bytes(uint32_t weight_type, size_t n);
// Quantizes n floats (finite; n a multiple of the weight block size) into act (act_bytes bytes).
// `scales` matters to the A32 layout only (A256's f32 scale is ggml's block_q8_K's too).
void quantize_act(uint32_t weight_type, const float* x, void* act, size_t n, ActScales scales = ActScales::F16);
// True for the weight types above (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K .. Q6_K, IQ4_XS).
bool has_quant_dot(uint32_t weight_type);
// Name of the Highway target these kernels dispatch to (their files also compile AVX3_DL, which
// simd::target_name()'s kernels do not; e.g. "AVX3_DL" on AVX-512 VNNI CPUs).
const char* quant_dot_target();

// y[t * ldy + r] = dot(W row r, activation row t) for r in [0, rows), t in [0, T).
// w points at the first weight row (rows are row_stride bytes apart); act at activation row 0
// (rows act_stride >= act_bytes bytes apart, a multiple of 4). n is a multiple of the block size.
// Each weight block is unpacked once and applied to up to 4 activation rows at a time; with many
// activation rows the work is tiled so weights and activations stay in L2 (results are unchanged).
void gemm_q(uint32_t weight_type, const void* w, size_t row_stride, size_t rows, const void* act,
            size_t act_stride, size_t T, size_t n, float* y, size_t ldy);

// ---------------------------------------------------------------------------------------------
// Packed (row-interleaved) weights: a load-time copy of a matrix in groups of kPackRows = 16 rows, so
// that one pass over a group computes 16 rows at once with each activation pair loaded once (one
// int32 lane per row: no horizontal sums per block). Same number of bytes as the ggml rows, except
// Q4_K and Q5_K (148 and 180 bytes per row and block instead of 144 and 176: their 6-bit scales and
// mins stored as bytes), Q3_K (114 instead of 110) and IQ4_XS (138 instead of 136): their 6-bit
// scales as bytes.
//
// Layout of one group (16 rows, n elements, nb = n / 32 blocks), block after block:
//   Q4_0: f16 d[16] (row r's scale), then 8 chunks of 32 bytes; chunk p holds, for r = 0..15, row r's
//         quant bytes 2p and 2p+1 (elements 2p, 2p+1 in the low nibbles, 2p+16, 2p+17 in the high).
//   Q8_0: f16 d[16], then 16 chunks of 32 bytes; chunk p holds, for r = 0..15, row r's int8 elements
//         2p and 2p+1.
//   Q4_1, Q5_0, Q5_1: f16 d[16], f16 m[16] (Q4_1, Q5_1), two fifth-bit planes of 32 bytes (Q5_0,
//         Q5_1; plane 0 / 1, row r, byte k: bit p is the fifth bit of element 2p+k / 16+2p+k, the
//         elements of chunk p's byte k), then Q4_0's 8 chunks. Per block the kernel sums code * x
//         (Q5_0: minus 16 * s) exactly, and Q4_1 / Q5_1 add m_w * ds_x to the f32 accumulator after
//         the d term.
//   IQ4_NL: Q4_0's layout; a nibble is an index into kIq4nlValues (no -8 offset).
//   IQ4_XS (nb = n / 256; 2208 bytes per block of 16 rows): f16 d[16], int8 scales[8 sub-blocks][16
//         rows] (ls_j - 32), then per sub-block j of 32 elements IQ4_NL's 8 chunks of 32 bytes (chunk p,
//         row r, byte k: row r's ggml quant byte 16j+2p+k: element 32j+2p+k in the low nibble,
//         32j+16+2p+k in the high). Per sub-block the kernel sums value * x exactly in int32, times
//         the scale (int32). Activations: A256.
//   Q5_K (nb = n / 256; 180 bytes per row and block): Q4_K's layout, then the 32 qh bytes in 16
//         chunks of 32 (chunk p, row r, byte k: qh byte 2p+k, whose bit j is the fifth bit of element
//         2p+k of sub-block j). Kernel as Q4_K's with codes 0..31.
//   Q2_K, Q3_K (nb = n / 256): sub-block sb = 8h + 2j + k of 16 elements (h < 2, j < 4, k < 2) has
//         its 2-bit codes at bits 2j of ggml's quant bytes 32h + 16k + l, l < 16; packed in 32 chunks
//         of 32 bytes (chunk c, row r, byte k: row r's quant byte 2c+k), so sub-block sb's elements
//         2p, 2p+1 are in chunk 16h + 8k + p. Q2_K (84 bytes per row and block, as ggml): f16 d[16],
//         f16 dmin[16], uint8 scales[16 sub-blocks][16 rows] as ggml's bytes (scale | min << 4), then
//         the chunks; per sub-block the kernel sums q * x, times the scale, and min * A256's 16-element
//         sum (bs16) for the -dmin term. Q3_K (114): f16 d[16], int8 scales[16][16] (scale - 32), the
//         chunks, then ggml's 32 hmask bytes in 16 chunks of pairs (chunk c: hmask bytes 2c, 2c+1; the
//         third bit of sub-block sb's element l is bit 4h + j of hmask byte 16k + l); per sub-block
//         the sum of (q - 4) * x times the scale.
//   Q6_K (nb = n / 256): f16 d[16], int8 scales[16 groups][16 rows], then per 16-element scale group
//         g: 4 chunks of 32 bytes (chunk p, row r, byte k: low nibble = low 4 bits of element
//         16g+2p+k, high nibble = those of element 16g+8+2p+k) and 2 chunks of 32 bytes for the top
//         2 bits (chunk c, row r, byte k: for p = 2c, 2c+1 at bit 4(p-2c): element 16g+2p+k's, then
//         at bit 4(p-2c)+2 element 16g+8+2p+k's). Activations: A256.
//   Q4_K (nb = n / 256; 2368 bytes per block of 16 rows): f16 d[16], f16 dmin[16], uint8
//         scales[8 sub-blocks][16 rows], then the mins as pairs: 4 chunks of 32 bytes (chunk k, row r:
//         min of sub-block 2k, then of 2k+1), all 6-bit values unpacked from ggml's 12 bytes; then
//         per 64-element part c = 0..3: 16 chunks of 32 bytes (chunk p, row r, byte k: row r's ggml
//         quant byte 32c+2p+k, i.e. element 64c+2p+k in the low nibble, 64c+32+2p+k in the high).
//         Per sub-block j of 32 the kernel sums q * x exactly in int32, times scale_j (int32); the
//         min term is sum_j min_j * bsum_j with A256's 32-element sums (int16 madd). Per block and
//         (row, token): acc += S * (d * d_x), then acc += M * (-dmin * d_x). Activations: A256.
// Any vector width reads a contiguous slice of each chunk (its rows), so the layout does not depend
// on the Highway target. Kernels: Highway's int16 madd (ReorderWidenMulAccumulate) with one int16
// activation pair broadcast per chunk, 8 tokens per unpacked block on AVX3/AVX3_DL (32 registers;
// Q6_K: 4) and 4 elsewhere. On AVX3_DL (AVX-512 VNNI; compiled by the quant_dot files only, see
// quant_dot_target) every packed type uses vpdpbusd instead (Q6_K: the 6-bit codes unsigned,
// minus 32 * A256's 16-element sums, times the group scale; 8 tokens per block): one 64-byte load covers chunks p and
// p+1, a vpermw gives each row's int32 lane its 4 bytes (elements 2p..2p+3 of the chunk's element
// runs), the weights are the unsigned operand (nibbles as they are; Q8_0 xor 0x80 = q + 128, minus
// 128 * s[b]; IQ4 nibbles looked up as value + 128 by vpshufb, minus 128 * the block's sum) and 4 consecutive int8 activations (q8) the broadcast signed one. Same layout, same
// exact int32 sums, so AVX3 and AVX3_DL (and AVX2: same FMA arithmetic) give the same bits.
// Per (row, token) the kernel sums exact int32 products per block and adds (int32 sum as f32) *
// (d_w * d_x) into an f32 accumulator block after block: the result does not depend on T, on the
// group range of the call or on the thread (it differs from gemm_q's rounding).
// On aarch64 CPUs with the Armv8.2 dot product (HWCAP_ASIMDDP), Highway's NEON target runs every
// packed type with sdot (gemm_packed_sdot-inl.h): one instruction per 4 int8 products per row, weight
// bytes paired per row as for VNNI (IQ4 values through a tbl lookup, read as signed), the same exact
// int32 sums, so the same bits.
constexpr size_t kPackRows = 16;
// True for the types with a packed layout: every type gemm_q reads.
bool has_packed(uint32_t weight_type);
// Bytes of one packed group of kPackRows rows of n elements.
size_t packed_group_bytes(uint32_t weight_type, size_t n);
// Packs `groups` groups of 16 ggml rows (row_stride bytes apart) into out (groups * group bytes).
void pack_rows(uint32_t weight_type, const void* w, size_t row_stride, size_t groups, size_t n, void* out);
// y[t * ldy + 16 * g + r] = dot(row r of packed group g, activation row t) for g < groups, t < T.
// packed points at the first group of the call; act as for gemm_q.
void gemm_packed(uint32_t weight_type, const void* packed, size_t groups, const void* act,
                 size_t act_stride, size_t T, size_t n, float* y, size_t ldy);
// Whether the packed kernels use sdot now: the CPU has it (aarch64 Linux, HWCAP_ASIMDDP), it is
// allowed (the default) and the dispatched target is NEON (the SVE targets keep their madd kernels).
// Tests turn it off to compare the two paths; the sums are the same integers.
bool packed_dotprod();
void set_packed_dotprod(bool allowed);
// The CPU has sdot and it is allowed, whatever the target (what the NEON kernels read).
bool dotprod_enabled();

}  // namespace towers::simd
