// The packing transforms of simd/quant_dot.h: ggml rows (simd/ggml_blocks.h) into groups of
// kPackRows = 16 rows, block by block, in the layouts gemm_packed reads. Scalar, target-independent
// (run once at load time).
#include <cstring>

#include "simd/quant_dot.h"
#include "simd/quant_layout.h"

namespace towers::simd {

namespace {
using namespace qd;  // NOLINT

// Calls pack_one(ggml block, packed block, r) for block b of row r of every group g, the packed
// block being block b of group g (kPackRows * packed_block_bytes(t) bytes each).
template <class Block, class PackOne>
void pack_groups(GgmlType t, const uint8_t* src, size_t row_stride, size_t groups, size_t n, uint8_t* dst,
                 PackOne pack_one) {
  const size_t nb = n / act_block(t), pb = kPackRows * packed_block_bytes(t);
  for (size_t g = 0; g < groups; ++g) {
    for (size_t b = 0; b < nb; ++b) {
      for (size_t r = 0; r < kPackRows; ++r) {
        const auto* row = reinterpret_cast<const Block*>(src + (g * kPackRows + r) * row_stride);
        pack_one(row[b], dst + (g * nb + b) * pb, r);
      }
    }
  }
}

// Element e (0..255) of a Q6_K block as its unsigned 6-bit code (the layout in ggml_blocks.h).
int q6k_code(const BlockQ6_K& blk, size_t e) {
  const size_t h = e / 128, l = e % 128, quarter = l / 32, ll = l % 32;
  const uint8_t L = blk.ql[64 * h + ll + 32 * (quarter & 1)];
  const int lo4 = quarter >= 2 ? L >> 4 : L & 15;
  const int hi2 = (blk.qh[32 * h + ll] >> (2 * quarter)) & 3;
  return lo4 | hi2 << 4;
}

void pack_q6k(const BlockQ6_K& blk, uint8_t* o, size_t r) {
  std::memcpy(o + kPackedD + 2 * r, blk.d.bytes, 2);
  for (size_t sg = 0; sg < 16; ++sg) o[kQ6KScales + kPackRows * sg + r] = static_cast<uint8_t>(blk.scales[sg]);
  for (size_t sg = 0; sg < 16; ++sg) {
    uint8_t* ql = o + kQ6KGroups + sg * kQ6KGroupBytes;
    uint8_t* qh = ql + 128;
    for (size_t p = 0; p < 4; ++p) {
      for (size_t k = 0; k < 2; ++k) {
        const int lo = q6k_code(blk, 16 * sg + 2 * p + k), hi = q6k_code(blk, 16 * sg + 8 + 2 * p + k);
        ql[32 * p + 2 * r + k] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
        uint8_t& h = qh[32 * (p / 2) + 2 * r + k];
        if (p % 2 == 0) h = 0;
        h |= static_cast<uint8_t>(((lo >> 4) | (hi >> 4) << 2) << (4 * (p % 2)));
      }
    }
  }
}

// Q4_K, and the first 148 bytes of Q5_K (the same fields).
template <class Block>
void pack_q4k(const Block& blk, uint8_t* o, size_t r) {
  std::memcpy(o + kPackedD + 2 * r, blk.d.bytes, 2);
  std::memcpy(o + kQ4KDmin + 2 * r, blk.dmin.bytes, 2);
  uint8_t sc[8], mn[8];
  unpack_scale_min_k4(blk.scales, sc, mn);
  for (size_t j = 0; j < 8; ++j) {
    o[kQ4KScales + kPackRows * j + r] = sc[j];
    o[kQ4KMins + 2 * kPackRows * (j / 2) + 2 * r + j % 2] = mn[j];
  }
  for (size_t c = 0; c < 4; ++c) {
    for (size_t p = 0; p < 16; ++p) {
      std::memcpy(o + kQ4KQuants + 512 * c + 32 * p + 2 * r, blk.qs + 32 * c + 2 * p, 2);
    }
  }
}

// Q5_K: Q4_K's layout, then the 32 qh bytes in pairs.
void pack_q5k(const BlockQ5_K& blk, uint8_t* o, size_t r) {
  pack_q4k(blk, o, r);
  for (size_t p = 0; p < 16; ++p) std::memcpy(o + kQ5KQh + 32 * p + 2 * r, blk.qh + 2 * p, 2);
}

// Q2_K: d, dmin, the 16 scale bytes as they are (scale | min << 4), then the 64 quant bytes in pairs.
void pack_q2k(const BlockQ2_K& blk, uint8_t* o, size_t r) {
  std::memcpy(o + kPackedD + 2 * r, blk.d.bytes, 2);
  std::memcpy(o + kQ2KDmin + 2 * r, blk.dmin.bytes, 2);
  for (size_t s = 0; s < 16; ++s) o[kQ2KScales + kPackRows * s + r] = blk.scales[s];
  for (size_t c = 0; c < 32; ++c) std::memcpy(o + kQ2KQuants + 32 * c + 2 * r, blk.qs + 2 * c, 2);
}

// Q3_K: d, the 16 scales as int8 (scale - 32), the 64 quant bytes in pairs, the 32 hmask bytes in pairs.
void pack_q3k(const BlockQ3_K& blk, uint8_t* o, size_t r) {
  std::memcpy(o + kPackedD + 2 * r, blk.d.bytes, 2);
  uint8_t sc[16];
  unpack_scales_q3k(blk.scales, sc);
  for (size_t s = 0; s < 16; ++s) o[kQ3KScales + kPackRows * s + r] = static_cast<uint8_t>(static_cast<int8_t>(sc[s] - 32));
  for (size_t c = 0; c < 32; ++c) std::memcpy(o + kQ3KQuants + 32 * c + 2 * r, blk.qs + 2 * c, 2);
  for (size_t c = 0; c < 16; ++c) std::memcpy(o + kQ3KHmask + 32 * c + 2 * r, blk.hmask + 2 * c, 2);
}

// IQ4_XS: d, the 8 scales as int8 (ls - 32), then per sub-block j the 16 quant bytes 16j.. in pairs
// (Q4_0's chunks, one set per sub-block).
void pack_iq4xs(const BlockIQ4_XS& blk, uint8_t* o, size_t r) {
  std::memcpy(o + kPackedD + 2 * r, blk.d.bytes, 2);
  for (int j = 0; j < 8; ++j) {
    o[kIQ4XSScales + kPackRows * j + r] = static_cast<uint8_t>(static_cast<int8_t>(iq4xs_scale(blk, j) - 32));
    uint8_t* sub = o + kIQ4XSQuants + kIQ4XSSubBytes * j;
    for (size_t p = 0; p < 8; ++p) std::memcpy(sub + 32 * p + 2 * r, blk.qs + 16 * j + 2 * p, 2);
  }
}

// Q4_0, Q8_0 and IQ4_NL: d, then the quant bytes in pairs (the chunks of quant_dot.h). Q4_1, Q5_0 and
// Q5_1 also m and the two fifth-bit planes: byte k of row r in plane 0 has at bit p the fifth bit of
// element 2p + k, in plane 1 that of element 16 + 2p + k (the elements of quant bytes 2p + k).
template <GgmlType kType, class Block>
void pack_legacy(const Block& blk, uint8_t* o, size_t r) {
  std::memcpy(o + kPackedD + 2 * r, blk.d.bytes, 2);
  if constexpr (kType == kQ4_1 || kType == kQ5_1) std::memcpy(o + kPackedM + 2 * r, blk.m.bytes, 2);
  if constexpr (kType == kQ5_0 || kType == kQ5_1) {
    uint32_t qh;
    std::memcpy(&qh, blk.qh, 4);
    for (size_t plane = 0; plane < 2; ++plane) {
      for (size_t k = 0; k < 2; ++k) {
        uint8_t bits = 0;
        for (size_t p = 0; p < 8; ++p) bits |= static_cast<uint8_t>(((qh >> (16 * plane + 2 * p + k)) & 1) << p);
        o[packed_qh_at(kType) + 32 * plane + 2 * r + k] = bits;
      }
    }
  }
  const size_t qs = packed_qs_at(kType);
  for (size_t p = 0; p < sizeof(blk.qs) / 2; ++p) std::memcpy(o + qs + 32 * p + 2 * r, blk.qs + 2 * p, 2);
}
}  // namespace

bool has_packed(uint32_t t) { return has_kernel(static_cast<GgmlType>(t)); }  // every gemm_q type

size_t packed_group_bytes(uint32_t t, size_t n) {
  const GgmlType type = static_cast<GgmlType>(t);
  return has_packed(t) ? kPackRows * qd::packed_block_bytes(type) * (n / qd::act_block(type)) : 0;
}

void pack_rows(uint32_t t, const void* w, size_t row_stride, size_t groups, size_t n, void* out) {
  const auto* src = static_cast<const uint8_t*>(w);
  auto* dst = static_cast<uint8_t*>(out);
  switch (static_cast<GgmlType>(t)) {
    case GgmlType::Q4_0: return pack_groups<BlockQ4_0>(kQ4_0, src, row_stride, groups, n, dst, pack_legacy<kQ4_0, BlockQ4_0>);
    case GgmlType::Q8_0: return pack_groups<BlockQ8_0>(kQ8_0, src, row_stride, groups, n, dst, pack_legacy<kQ8_0, BlockQ8_0>);
    case GgmlType::Q4_K: return pack_groups<BlockQ4_K>(kQ4_K, src, row_stride, groups, n, dst, pack_q4k<BlockQ4_K>);
    case GgmlType::Q5_K: return pack_groups<BlockQ5_K>(kQ5_K, src, row_stride, groups, n, dst, pack_q5k);
    case GgmlType::Q4_1:
      return pack_groups<BlockQ4_1>(kQ4_1, src, row_stride, groups, n, dst, pack_legacy<kQ4_1, BlockQ4_1>);
    case GgmlType::Q5_0:
      return pack_groups<BlockQ5_0>(kQ5_0, src, row_stride, groups, n, dst, pack_legacy<kQ5_0, BlockQ5_0>);
    case GgmlType::Q5_1:
      return pack_groups<BlockQ5_1>(kQ5_1, src, row_stride, groups, n, dst, pack_legacy<kQ5_1, BlockQ5_1>);
    case GgmlType::Q6_K: return pack_groups<BlockQ6_K>(kQ6_K, src, row_stride, groups, n, dst, pack_q6k);
    case GgmlType::IQ4_NL:
      return pack_groups<BlockIQ4_NL>(kIQ4_NL, src, row_stride, groups, n, dst, pack_legacy<kIQ4_NL, BlockIQ4_NL>);
    case GgmlType::IQ4_XS: return pack_groups<BlockIQ4_XS>(kIQ4_XS, src, row_stride, groups, n, dst, pack_iq4xs);
    case GgmlType::Q2_K: return pack_groups<BlockQ2_K>(kQ2_K, src, row_stride, groups, n, dst, pack_q2k);
    case GgmlType::Q3_K: return pack_groups<BlockQ3_K>(kQ3_K, src, row_stride, groups, n, dst, pack_q3k);
    default: return;
  }
}

}  // namespace towers::simd
