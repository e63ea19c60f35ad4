// Tensor element types as numbered in GGUF files (ggml's enum), with their block geometry.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "simd/ggml_blocks.h"

namespace towers {

using simd::GgmlType;  // the ids and their block structs: simd/ggml_blocks.h

struct GgmlTypeTraits {
  std::string_view name;
  uint32_t block_elems;  // elements per block (1 for plain floats)
  uint32_t block_bytes;  // bytes per block
  bool supported;        // we can dequantize it
};

// Traits of a raw type id from a file, or nullopt for ids we do not know at all.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t raw_type);
inline GgmlTypeTraits traits(GgmlType t) { return *ggml_type_traits(static_cast<uint32_t>(t)); }
std::string_view ggml_type_name(GgmlType t);
// Comma-separated list of the types we can load, for error messages.
std::string_view supported_ggml_types();

// Bytes of a row of n elements; n must be a multiple of the block size (checked by callers).
inline size_t row_bytes(GgmlType t, uint64_t n) {
  auto tr = traits(t);
  return static_cast<size_t>(n / tr.block_elems) * tr.block_bytes;
}

}  // namespace towers
