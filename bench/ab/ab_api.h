// The kernel entry points bench/ab/ab_kernels.cc compares, as plain function pointers, so that two
// versions of simd/ (an old one renamed to towers::simd_old, and this tree's) can live in one process.
#pragma once
#include <cstddef>
#include <cstdint>

namespace towers::ab {

struct KernelApi {
  size_t (*act_bytes)(uint32_t type, size_t n);
  void (*quantize_act)(uint32_t type, const float* x, void* act, size_t n);
  void (*gemm_q)(uint32_t type, const void* w, size_t row_stride, size_t rows, const void* act,
                 size_t act_stride, size_t T, size_t n, float* y, size_t ldy);
  size_t (*packed_group_bytes)(uint32_t type, size_t n);
  void (*pack_rows)(uint32_t type, const void* w, size_t row_stride, size_t groups, size_t n, void* out);
  void (*gemm_packed)(uint32_t type, const void* packed, size_t groups, const void* act, size_t act_stride,
                      size_t T, size_t n, float* y, size_t ldy);
  // KV formats as the numbers of simd::KvQuant (F32 0 .. Q4 4).
  size_t (*kv_vec_bytes)(int q, int dim);
  void (*kv_quantize)(int q, const float* x, void* dst, int dim);
  void (*kv_dot_group)(int q, const float* qv, int n_q, const void* k, size_t stride, int n, int dim,
                       float* scores, size_t score_stride);
  void (*kv_accumulate_group)(int q, const float* p, size_t p_stride, int n_q, const void* v, size_t stride,
                              int n, int dim, float* acc);
  void (*kv_attend)(int q, const float* qv, int n_q, const void* k, const void* v, size_t stride, int n, int dim,
                    float scale, float* m, float* l, float* acc);
};

KernelApi old_api();  // ab_adapter.cc compiled against the old tree (AB_OLD)
KernelApi new_api();  // ab_adapter.cc compiled against this tree

}  // namespace towers::ab
