// Where things are in the byte layouts of simd/quant_dot.h, for the files that implement it
// (quant_act.cc, gemm_q.cc, pack_rows.cc, gemm_packed.cc): the weight types with kernels, the
// quantized activation rows (ActRow) and the packed groups' geometry. Target-independent.
#pragma once
#include <cstddef>
#include <cstdint>

#include "simd/ggml_blocks.h"
#include "simd/quant_dot.h"

namespace towers::simd::qd {

constexpr GgmlType kQ4_0 = GgmlType::Q4_0, kQ4_1 = GgmlType::Q4_1, kQ5_0 = GgmlType::Q5_0,
                   kQ5_1 = GgmlType::Q5_1, kQ8_0 = GgmlType::Q8_0, kIQ4_NL = GgmlType::IQ4_NL,
                   kQ2_K = GgmlType::Q2_K, kQ3_K = GgmlType::Q3_K, kQ4_K = GgmlType::Q4_K,
                   kQ5_K = GgmlType::Q5_K, kQ6_K = GgmlType::Q6_K, kIQ4_XS = GgmlType::IQ4_XS;

// The super-block (256-element) types gemm_q reads: they read A256 activations.
constexpr bool is_k(GgmlType t) {
  return t == kQ2_K || t == kQ3_K || t == kQ4_K || t == kQ5_K || t == kQ6_K || t == kIQ4_XS;
}
// The weight types gemm_q reads (has_quant_dot): the K types above and these blocks of 32 (A32).
constexpr bool has_kernel(GgmlType t) {
  return is_k(t) || t == kQ4_0 || t == kQ4_1 || t == kQ5_0 || t == kQ5_1 || t == kQ8_0 || t == kIQ4_NL;
}
// Elements per activation block (32 or 256) and ggml bytes per weight block.
constexpr size_t act_block(GgmlType t) { return is_k(t) ? kQK_K : kQK; }
constexpr size_t block_bytes(GgmlType t) { return block_shape(t).bytes; }

// Pointers into one quantized activation row (layouts A32 and A256 in quant_dot.h).
struct ActRow {
  const int16_t* q;
  const float* d;
  const float* ds;      // A32 only
  const int16_t* bs;    // A256 only: 8 sums of 32 per block
  const int32_t* s;     // A32 only: exact sum of q per block
  const int8_t* q8;     // the same q as int8 (for the VNNI kernels)
  const int16_t* bs16;  // A256 only: 16 sums of 16 per block (the Q6_K scale groups)
};
// Byte offsets of the arrays of a row of n elements (nb = n / 32 for A32, n / 256 for A256; 0 for the
// arrays the layout does not have), and its size.
struct ActOffsets {
  size_t d, ds, s, bs, q8, bs16, bytes;
};
constexpr ActOffsets act_offsets(GgmlType t, size_t n) {
  if (is_k(t)) {
    const size_t nb = n / kQK_K;
    return {2 * n, 0, 0, 2 * n + 4 * nb, 2 * n + 20 * nb, 3 * n + 20 * nb, 3 * n + 52 * nb};
  }
  const size_t nb = n / kQK;
  return {2 * n, 2 * n + 4 * nb, 2 * n + 8 * nb, 0, 2 * n + 12 * nb, 0, 3 * n + 12 * nb};
}
inline ActRow act_row(GgmlType t, const uint8_t* a, size_t n) {
  const ActOffsets o = act_offsets(t, n);
  ActRow r{};
  r.q = reinterpret_cast<const int16_t*>(a);
  r.d = reinterpret_cast<const float*>(a + o.d);
  r.q8 = reinterpret_cast<const int8_t*>(a + o.q8);
  if (is_k(t)) {
    r.bs = reinterpret_cast<const int16_t*>(a + o.bs);
    r.bs16 = reinterpret_cast<const int16_t*>(a + o.bs16);
  } else {
    r.ds = reinterpret_cast<const float*>(a + o.ds);
    r.s = reinterpret_cast<const int32_t*>(a + o.s);
  }
  return r;
}

// Activation rows processed together per unpacked weight block: gemm_q 4; the packed kernels up to
// 8 on targets with 32 vector registers (kPackR, per target).
constexpr size_t kMaxR = 4;
constexpr size_t kMaxPackR = 8;

// Bytes per row and block of the packed layouts (quant_dot.h): Q4_K and Q5_K store their 12 bytes of
// 6-bit scales and mins as 16 bytes, IQ4_XS its 6 bytes of 6-bit scales as 8 int8 (scale - 32), Q3_K its 12
// as 16 int8 and its high bits in pairs; the others keep the ggml block size.
constexpr size_t packed_block_bytes(GgmlType t) {
  return t == kQ4_K ? 148 : t == kQ5_K ? 180 : t == kIQ4_XS ? 138 : t == kQ3_K ? 114 : block_bytes(t);
}
// Byte offsets inside one packed block of kPackRows rows (quant_dot.h). All types start with the
// rows' f16 d; Q4_0, Q8_0 and IQ4_NL continue with their quant chunks, Q6_K and IQ4_XS with their
// int8 scales.
constexpr size_t kPackedD = 0, kPackedQs = 2 * kPackRows;
constexpr size_t kQ6KScales = 2 * kPackRows, kQ6KGroups = kQ6KScales + 16 * kPackRows, kQ6KGroupBytes = 192;
constexpr size_t kQ4KDmin = 2 * kPackRows, kQ4KScales = 4 * kPackRows, kQ4KMins = 12 * kPackRows,
                 kQ4KQuants = 20 * kPackRows, kQ5KQh = 148 * kPackRows;
// Q4_1, Q5_0, Q5_1: the rows' f16 m (Q4_1, Q5_1) after d, then the fifth-bit planes (Q5_0, Q5_1: two
// chunks), then the quant chunks as Q4_0's.
constexpr size_t kPackedM = 2 * kPackRows;
constexpr size_t packed_qh_at(GgmlType t) { return t == kQ5_1 ? 4 * kPackRows : 2 * kPackRows; }
constexpr size_t kQ2KDmin = 2 * kPackRows, kQ2KScales = 4 * kPackRows, kQ2KQuants = 20 * kPackRows;
constexpr size_t kQ3KScales = 2 * kPackRows, kQ3KQuants = 18 * kPackRows, kQ3KHmask = 82 * kPackRows;
// Where a block's quant chunks start: the 32-element types' (Q4_0's chunks) and Q2_K's / Q3_K's.
constexpr size_t packed_qs_at(GgmlType t) {
  return t == kQ4_1 ? 4 * kPackRows : t == kQ5_0 ? 6 * kPackRows : t == kQ5_1 ? 8 * kPackRows
         : t == kQ2_K ? kQ2KQuants : t == kQ3_K ? kQ3KQuants : kPackedQs;
}
// Where Q2_K's / Q3_K's per-sub-block scale bytes start.
constexpr size_t packed_scales_at(GgmlType t) { return t == kQ2_K ? kQ2KScales : kQ3KScales; }
constexpr size_t kIQ4XSScales = 2 * kPackRows, kIQ4XSQuants = 10 * kPackRows, kIQ4XSSubBytes = 256;
static_assert(kQ4KDmin == kQ2KDmin, "the packed kernels read Q4_K's and Q2_K's dmin at one offset");

}  // namespace towers::simd::qd
