// Block geometry of the quantized KV vectors (layouts in kv_quant.h), shared by the scalar codec
// (kv_codec.cc) and the attention kernels (kv_quant.cc).
#pragma once
#include <cstddef>

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

}  // namespace towers::simd::kvq
