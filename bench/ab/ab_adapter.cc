// Wraps one version of simd/'s kernels into a KernelApi (bench/ab/ab_api.h). Compiled twice by
// bench/ab/ab_kernels.sh: against this tree, and with -DAB_OLD against an old tree whose simd/ was
// renamed to towers::simd_old.
#include "bench/ab/ab_api.h"
#include "simd/attention.h"
#include "simd/kv_quant.h"
#include "simd/quant_dot.h"

#ifdef AB_OLD
namespace kern = towers::simd_old;
#define AB_FACTORY old_api
#else
namespace kern = towers::simd;
#define AB_FACTORY new_api
#endif

namespace towers::ab {

KernelApi AB_FACTORY() {
  KernelApi a{};
  a.act_bytes = &kern::act_bytes;
  a.quantize_act = [](uint32_t t, const float* x, void* act, size_t n) { kern::quantize_act(t, x, act, n); };
  a.gemm_q = &kern::gemm_q;
  a.packed_group_bytes = &kern::packed_group_bytes;
  a.pack_rows = &kern::pack_rows;
  a.gemm_packed = &kern::gemm_packed;
  a.kv_vec_bytes = [](int q, int dim) { return kern::kv_vec_bytes(static_cast<kern::KvQuant>(q), dim); };
  a.kv_quantize = [](int q, const float* x, void* dst, int dim) {
    kern::kv_quantize(static_cast<kern::KvQuant>(q), x, dst, dim);
  };
  a.kv_dot_group = [](int q, const float* qv, int n_q, const void* k, size_t stride, int n, int dim, float* s,
                      size_t ss) { kern::kv_dot_group(static_cast<kern::KvQuant>(q), qv, n_q, k, stride, n, dim, s, ss); };
  a.kv_accumulate_group = [](int q, const float* p, size_t ps, int n_q, const void* v, size_t stride, int n,
                             int dim, float* acc) {
    kern::kv_accumulate_group(static_cast<kern::KvQuant>(q), p, ps, n_q, v, stride, n, dim, acc);
  };
  a.kv_attend = [](int q, const float* qv, int n_q, const void* k, const void* v, size_t stride, int n, int dim,
                   float scale, float* m, float* l, float* acc) {
    kern::kv_attend(static_cast<kern::KvQuant>(q), qv, n_q, k, v, stride, n, dim, scale, m, l, acc);
  };
  return a;
}

}  // namespace towers::ab
