// Bit-exact readers (and writers) of ggml's block formats.
// dequantize_row reproduces ggml's dequantize_row_* exactly (same float operations, same order).
// quantize_row writes valid blocks; it follows ggml's reference quantizers but is only required to be
// a faithful encoder, not bit-identical to ggml's output (it is used to make synthetic models).
#pragma once
#include <cstddef>
#include <cstdint>

#include "engine/gguf/ggml_type.h"
#include "simd/f16.h"

namespace towers {

// The scalar f16/bf16 conversions these formats use (defined once, in simd/f16.h).
using simd::bf16_to_f32;
using simd::f32_to_bf16;
using simd::f32_to_fp16;
using simd::fp16_to_f32;

// n must be a multiple of the type's block size. src points at row_bytes(type, n) bytes.
void dequantize_row(GgmlType type, const void* src, float* dst, size_t n);
// Supported for every type that dequantize_row supports.
void quantize_row(GgmlType type, const float* src, void* dst, size_t n);

}  // namespace towers
