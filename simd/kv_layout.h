// Block geometry of the quantized KV vectors (layouts in kv_quant.h), shared by the scalar codec
// (kv_codec.cc) and the attention kernels (kv_quant.cc).
#pragma once
#include <cstddef>
#include <cstdint>

#include "simd/kv_quant.h"

namespace towers::simd::kvq {

constexpr int kMaxBlocks = kKvMaxDim / kKvBlock;

inline int n_blocks(int dim) { return (dim + kKvBlock - 1) / kKvBlock; }
// f16 parameters per block: Q8 d; Q6/Q4 d and m; none for F32/F16.
constexpr int params_per_block(KvQuant q) {
  return q == KvQuant::Q8 ? 1 : (q == KvQuant::Q6 || q == KvQuant::Q4) ? 2 : 0;
}
// Bytes of the f16 parameters at the start of a vector (the codes follow).
inline size_t header_bytes(KvQuant q, int dim) { return size_t(2 * params_per_block(q) * n_blocks(dim)); }

// kv_quant_ok and kv_vec_bytes, inline here so that the kernels compute a vector's size in place.
inline bool quant_ok(KvQuant q, int dim) {
  return static_cast<uint8_t>(q) <= static_cast<uint8_t>(KvQuant::Q4) && dim >= kKvMinDim && dim <= kKvMaxDim &&
         dim % 8 == 0;
}
inline size_t vec_bytes(KvQuant q, int dim) {
  if (!quant_ok(q, dim)) return 0;
  const size_t D = static_cast<size_t>(dim), hdr = header_bytes(q, dim);
  switch (q) {
    case KvQuant::F32: return 4 * D;
    case KvQuant::F16: return 2 * D;
    case KvQuant::Q8: return hdr + D;
    case KvQuant::Q6: return hdr + D / 2 + D / 4;
    case KvQuant::Q4: return hdr + D / 2;
  }
  return 0;
}

}  // namespace towers::simd::kvq
