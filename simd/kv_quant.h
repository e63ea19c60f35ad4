// Quantized KV-cache vectors and the two attention kernels that read them in place (the scalar codec
// is kv_codec.cc, the kernels kv_quant.cc).
//
// One *vector* is one (token, KV head) row of a K or V cache: `dim` = head_dim elements, any multiple
// of 8 from 8 to 256 (kKvMaxDim). Shared prompt segments store their KV once in one of these formats
// (deeper, more shared segments get fewer bits: platform Q4, community Q6, bot Q8, transcript F16).
// Attention never rebuilds a dense f32 cache: kv_dot_many computes q·k straight from the codes and
// kv_accumulate adds p·v straight from the codes, 8 elements at a time in registers.
//
// ---------------------------------------------------------------------------------------------
// Byte layouts (little-endian; no alignment required; a caller may put vectors any `stride` >=
// kv_vec_bytes apart). Quantized formats split a vector into nb = ceil(dim / 32) blocks of 32
// consecutive elements (the last one shorter when dim % 32 != 0: 8, 16 or 24 elements), each with its
// own parameters. "f16" is IEEE binary16.
//
//   F32  float x[dim]                                                     4*dim bytes
//   F16  f16   x[dim]                                                     2*dim bytes
//   Q8   f16   d[nb]             block scale                              2*nb + dim bytes
//        int8  c[dim]            x = d[e/32] * c[e],  c in [-127, 127]    (symmetric)
//   Q6   f16   dm[2*nb]          block b: d = dm[2b], m = dm[2b+1]       4*nb + 3*dim/4 bytes
//        u8    lo[dim/2]         low 4 bits of each code, laid out as Q4's codes (below)
//        u8    hi[dim/4]         high 2 bits of each code: for each whole block Q of 32 elements,
//                                byte 8Q + k holds those of elements 32Q + k, +8, +16, +24 (k < 8) at
//                                bits 0, 2, 4, 6; the elements of a last partial block follow in
//                                order, four per byte, first at bits 0-1
//                                x = m + d * c,  c in [0, 63]             (asymmetric)
//   Q4   f16   dm[2*nb]          as Q6                                    4*nb + dim/2 bytes
//        u8    lo[dim/2]         4-bit codes in runs of 16 elements: byte 8R + k holds element
//                                16R + k (low nibble) and 16R + 8 + k (high nibble), k < 8; when
//                                dim % 16 == 8 the last 8 elements follow in order, two per byte,
//                                first in the low nibble
//                                x = m + d * c,  c in [0, 15]
//
//   bytes per vector   dim=8   64   128   256      (bits per element at 128)
//        F32             32   256   512  1024      32
//        F16             16   128   256   512      16
//        Q8              10    68   136   272      8.5
//        Q6              10    56   112   224      7
//        Q4               8    40    80   160      5
//
// Why these choices (measured, relative RMS error, 20000 vectors; see tests/test_kv_quant.cc):
// - Blocks of 32 with their own parameters: at dim 128 one set of parameters per vector gives Q4
//   0.100 (Gaussian) / 0.202 (a few 10x outlier channels); blocks of 32 give 0.078 / 0.104. Q8 and Q6
//   gain alike (Q6 0.048 -> 0.025 with outliers). Cost: 0.5 bit per element for Q4/Q6, 0.25 for Q8.
// - Parameters as f16 rather than f32: the error is the same to 3 digits (<0.3% worse), and f32 would
//   make Q4 20% bigger (96 instead of 80 bytes at dim 128). f16's range is what limits it: inputs are
//   saturated to +-65504 (as the F16 format must be anyway), and block ranges below ~1e-3 lose
//   relative precision (subnormal scales; below ~1e-7 a block becomes exactly its min). KV values of
//   real models are far from both ends.
// - The f16 parameters are rounded *outward* before the codes are chosen: the min down, the scale
//   up, so the grid [m, m + 15d] (or [-127d, 127d]) always covers the block and every element is off by
//   at most d/2 (no clamping error, even for a block of large values with a small spread).
// - Code planes are arranged for 8-lane unpacking: 8 bytes of Q4 codes widen to 8 lanes that give
//   two groups of 8 elements (AND 15, >> 4); Q6 adds 8 bytes that give the high bits of a whole block
//   (four shifts). Q6 as a 4-bit plane (the Q4 layout) plus a 2-bit plane rather than 4 codes in 3
//   bytes: no code crosses a byte. The tails (dim % 16 or dim % 32 != 0) are stored sequentially and
//   unpacked with one broadcast and one per-lane shift per group of 8, so any multiple of 8 works
//   with no padding.
// - Codes: round to nearest, ties to even. A block whose max equals its min stores d = 0 and codes 0
//   when the value is an f16 (exact), else a tiny d that reconstructs it within d/2.
//
// Quantization is scalar C++ (not SIMD): the stored bytes are the same on every machine and target,
// so segment files and their hashes do not depend on the CPU that wrote them. NaN inputs become 0.
//
// ---------------------------------------------------------------------------------------------
// Kernels and determinism.
// kv_dot_many, per vector j:  score = sum_b ( d_b * sum_{e in b} q_e c_e  +  m_b * sum_{e in b} q_e )
// with the per-block sums of q computed once per call (not per vector). The products q_e c_e are f32
// fused multiply-adds in 8 lanes (256-bit operations, also on AVX-512; 4 lanes on 128-bit targets),
// in a fixed order, four vectors at a time (a last group of fewer repeats its last vector and drops
// the copies). The score of vector j therefore depends only on q and vector j: not on n, on the
// other vectors, or on how the caller splits the range (n vectors in one call equal n calls with
// n = 1, bit for bit). On x86 (AVX2, AVX-512), kv_dot_group with 8 or more queries runs the same
// chains and the same final tree with keys in lanes (a block of 8 or 16 keys decoded and transposed
// once for all the queries; no horizontal sum per score), and kv_accumulate_group sums over a
// contiguous f32 copy of the vectors' codes, in 16 lanes on AVX-512: the same operations, so the same
// bits (kv_quant.cc, "x86"); a prefill tile's attention runs ~2x faster in every format
// (bench/README.md, issue 26).
// kv_accumulate, per element e and vector j in ascending order:
//     Q6/Q4:   acc[e] = acc[e] + fma(p_j * d_b, c_e, p_j * m_b)
//     Q8:      acc[e] = fma(p_j * d_b, c_e, acc[e])
//     F32/F16: acc[e] = fma(p_j, x_e, acc[e])
// (the products p_j * d_b, p_j * m_b are f32 scalars, computed the same way in every call)
// acc is the only state carried between vectors, so splitting [0, n) into consecutive calls, in
// order, gives the same bits as one call. kv_accumulate works block by block over chunks of 64
// vectors, with a block's 32 accumulators in registers. Results do depend on the Highway target
// (lane count, FMA availability), like every other reduction in simd/ (docs/numerics.md).
//
// Speed (bench/bench_kv_quant, one Zen 3 core of a shared VM, dim 128, n = 4096, ns per vector,
// scores / weighted sum; +-15% run to run):
//   in cache       F32 9.4/9.7   F16 6.1/7.1   Q8 9.3/8.4    Q6 18.6/18.8   Q4 12.1/13.9
//   from DRAM      F32 36/45     F16 18/19     Q8 12/14      Q6 18/21       Q4 12/15
// Q8/Q6/Q4 are compute-bound (unpacking, int->float conversion); from DRAM F32/F16 are bandwidth-bound.
#pragma once
#include <cstddef>
#include <cstdint>

namespace towers::simd {

enum class KvQuant : uint8_t { F32 = 0, F16 = 1, Q8 = 2, Q6 = 3, Q4 = 4 };

inline constexpr int kKvMinDim = 8;
inline constexpr int kKvMaxDim = 256;
inline constexpr int kKvBlock = 32;  // elements per parameter block of Q8/Q6/Q4

// "f32", "f16", "q8", "q6", "q4" ("?" for anything else).
const char* kv_quant_name(KvQuant);
// True when dim is a multiple of 8 in [kKvMinDim, kKvMaxDim] and q is one of the five formats.
bool kv_quant_ok(KvQuant q, int dim);
// Bytes of one quantized vector of `dim` elements (0 when !kv_quant_ok).
size_t kv_vec_bytes(KvQuant q, int dim);

// One vector: x[dim] -> dst[kv_vec_bytes]. Inputs are saturated to +-65504 (except F32, copied as is).
void kv_quantize(KvQuant q, const float* x, void* dst, int dim);
// One vector back to f32 (tests, materialising; never in the attention loop): Q8 d*c, Q6/Q4 m + d*c
// (d*c is exact, so one f32 rounding), F16 exact. The kernels use the same d, m and codes.
void kv_dequantize(KvQuant q, const void* src, float* x, int dim);

// scores[j] = dot(qv, dequant(vector j)) for j < n; vector j starts at k + j*stride.
void kv_dot_many(KvQuant q, const float* qv, const void* k, size_t stride, int n, int dim, float* scores);
// acc[i] += sum_j p[j] * dequant(vector j)[i], j ascending; vector j starts at v + j*stride.
void kv_accumulate(KvQuant q, const float* p, const void* v, size_t stride, int n, int dim, float* acc);

// The same for the n_q query heads of one GQA group (they read the same K/V vectors): query g is at
// qv + g*dim, its scores go to scores + g*score_stride, its weights are p + g*p_stride and its sums
// acc + g*dim. Each vector is loaded and decoded once for up to four queries instead of once per query.
// Results are bit-identical to kv_dot_many / kv_accumulate called for each query alone (the same
// operations in the same order per query; only independent chains are interleaved).
// n_ahead: the n_ahead vectors after the last one (at k + (n + i)*stride) exist and are read next
// (the following block of a span); the kernels prefetch a few vectors ahead, into them too.
void kv_dot_group(KvQuant q, const float* qv, int n_q, const void* k, size_t stride, int n, int dim, float* scores,
                  size_t score_stride, int n_ahead = 0);
void kv_accumulate_group(KvQuant q, const float* p, size_t p_stride, int n_q, const void* v, size_t stride, int n,
                         int dim, float* acc, int n_ahead = 0);

// (Functions other than kv_quant_name/kv_quant_ok/kv_vec_bytes do nothing when !kv_quant_ok.)

}  // namespace towers::simd
