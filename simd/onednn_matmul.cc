// oneDNN's int8 GEMM for prefill (see onednn_matmul.h). Built with oneDNN when TOWERS_HAVE_ONEDNN is
// defined (CMake option TOWERS_ONEDNN); otherwise every entry point says "not available".
#include "simd/onednn_matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#ifdef TOWERS_HAVE_ONEDNN
#include <omp.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace towers::simd {

namespace {

// Symmetric quantization of one group: scale = max|v| / qmax, q = round-to-nearest-even(v / scale).
void quantize_groups(const float* v, int8_t* q, float* scales, size_t k, size_t group, int qmax) {
  for (size_t g = 0; g < k / group; ++g) {
    const float* src = v + g * group;
    float amax = 0;
    for (size_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(src[i]));
    const float scale = amax / static_cast<float>(qmax);
    const float inv = amax > 0 ? static_cast<float>(qmax) / amax : 0.f;
    scales[g] = scale;
    for (size_t i = 0; i < group; ++i) {
      const long r = std::lrintf(src[i] * inv);
      q[g * group + i] = static_cast<int8_t>(std::clamp<long>(r, -qmax, qmax));
    }
  }
}

}  // namespace

void onednn_quantize_weights(const float* w, int8_t* q, float* scales, size_t k, size_t group) {
  quantize_groups(w, q, scales, k, group, kOnednnWeightMax);
}

void onednn_quantize_act(const float* x, int8_t* q, float* scales, size_t k, size_t group) {
  quantize_groups(x, q, scales, k, group, kOnednnActMax);
}

#ifdef TOWERS_HAVE_ONEDNN

namespace {

using dt = dnnl::memory::data_type;
using dim = dnnl::memory::dim;

// int32 sums of one group: src [M x group] s8 (row stride k) times weights [group x rows] s8 (rows k
// apart) into dst [M x rows] s32. M is a run-time dimension, so one primitive serves every token count.
struct GroupGemm {
  dnnl::memory::desc src, wei, dst;
  dnnl::matmul mm;
};

struct Runtime {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  std::string describe;
  bool ok = false;
  std::mutex mu;
  std::map<std::tuple<size_t, size_t, size_t>, std::shared_ptr<const GroupGemm>> cache;  // (rows, k, group)

  std::shared_ptr<const GroupGemm> get(size_t rows, size_t k, size_t group) {
    std::lock_guard lock(mu);
    auto& slot = cache[{rows, k, group}];
    if (!slot) {
      auto g = std::make_shared<GroupGemm>();
      const dim M = DNNL_RUNTIME_DIM_VAL, K = dim(group), N = dim(rows);
      g->src = dnnl::memory::desc({M, K}, dt::s8, dnnl::memory::dims{dim(k), 1});
      g->wei = dnnl::memory::desc({K, N}, dt::s8, dnnl::memory::dims{1, dim(k)});
      g->dst = dnnl::memory::desc({M, N}, dt::s32, dnnl::memory::dims{N, 1});
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(g->src, g->wei, g->dst), eng);
      g->mm = dnnl::matmul(pd);
      slot = std::move(g);
    }
    return slot;
  }
};

Runtime& runtime() {
  static Runtime* rt = [] {
    auto* r = new Runtime;  // never destroyed: worker threads may still run at exit
    const dnnl::version_t* v = dnnl::version();
    char ver[64];
    std::snprintf(ver, sizeof ver, "oneDNN %d.%d.%d", v->major, v->minor, v->patch);
    try {
      dnnl::matmul::primitive_desc pd(
          dnnl::matmul::desc(dnnl::memory::desc({64, 256}, dt::s8, dnnl::memory::format_tag::ab),
                             dnnl::memory::desc({256, 64}, dt::s8, dnnl::memory::format_tag::ba),
                             dnnl::memory::desc({64, 64}, dt::s32, dnnl::memory::format_tag::ab)),
          r->eng);
      r->describe = std::string(ver) + " (" + pd.impl_info_str() + ")";
      r->ok = true;
    } catch (const dnnl::error& e) {
      r->describe = std::string(ver) + ": no int8 matmul on this CPU (" + e.what() + ")";
    }
    return r;
  }();
  return *rt;
}

// dst (+)= float(isum) * (a_scale * w_scale) for one group; the first group writes.
void apply_group(const int32_t* isum, size_t M, size_t rows, const float* act_scales, size_t groups, size_t g,
                 const float* w_scales, float* y, size_t ldy) {
  for (size_t m = 0; m < M; ++m) {
    const float as = act_scales[m * groups + g];
    const int32_t* s = isum + m * rows;
    float* out = y + m * ldy;
    if (g == 0) {
      for (size_t n = 0; n < rows; ++n) out[n] = static_cast<float>(s[n]) * (as * w_scales[n * groups]);
    } else {
      for (size_t n = 0; n < rows; ++n) out[n] += static_cast<float>(s[n]) * (as * w_scales[n * groups + g]);
    }
  }
}

// The groups of rows [0, rows) of w, in order, on the calling thread's OpenMP setting.
void run_groups(const int8_t* w, const float* w_scales, size_t rows, const int8_t* act, const float* act_scales,
                size_t M, size_t k, size_t group, float* y, size_t ldy) {
  Runtime& rt = runtime();
  const std::shared_ptr<const GroupGemm> gg = rt.get(rows, k, group);
  thread_local dnnl::stream strm(rt.eng);
  thread_local std::vector<int32_t> isum;
  isum.resize(M * rows);
  const dim Md = dim(M), Kd = dim(group), Nd = dim(rows);
  const dnnl::memory::desc src({Md, Kd}, dt::s8, dnnl::memory::dims{dim(k), 1});
  const dnnl::memory::desc dst({Md, Nd}, dt::s32, dnnl::memory::dims{Nd, 1});
  const size_t groups = k / group;
  for (size_t g = 0; g < groups; ++g) {
    dnnl::memory a(src, rt.eng, const_cast<int8_t*>(act + g * group));
    dnnl::memory b(gg->wei, rt.eng, const_cast<int8_t*>(w + g * group));
    dnnl::memory c(dst, rt.eng, isum.data());
    gg->mm.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    strm.wait();
    apply_group(isum.data(), M, rows, act_scales, groups, g, w_scales, y, ldy);
  }
}

}  // namespace

bool onednn_available() { return runtime().ok; }
const char* onednn_describe() { return runtime().describe.c_str(); }

bool onednn_gemm(const int8_t* w, const float* w_scales, size_t n0, size_t n1, const int8_t* act,
                 const float* act_scales, size_t M, size_t k, size_t group, float* y, size_t ldy) {
  if (!onednn_available() || n1 <= n0 || M == 0) return false;
  // Our pool's threads are the parallelism: oneDNN's OpenMP runs this call inline on this thread
  // (the setting is per thread; a second OpenMP team would fight the pool for the cores).
  omp_set_num_threads(1);
  const size_t groups = k / group;
  run_groups(w + n0 * k, w_scales + n0 * groups, n1 - n0, act, act_scales, M, k, group, y + n0, ldy);
  return true;
}

bool onednn_gemm_omp(const int8_t* w, const float* w_scales, size_t n, const int8_t* act, const float* act_scales,
                     size_t M, size_t k, size_t group, float* y, size_t ldy, int threads) {
  if (!onednn_available() || n == 0 || M == 0) return false;
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  run_groups(w, w_scales, n, act, act_scales, M, k, group, y, ldy);
  omp_set_num_threads(before);
  return true;
}

#else  // !TOWERS_HAVE_ONEDNN

bool onednn_available() { return false; }
const char* onednn_describe() { return "oneDNN: not in this build (TOWERS_ONEDNN off or libdnnl-dev absent)"; }
bool onednn_gemm(const int8_t*, const float*, size_t, size_t, const int8_t*, const float*, size_t, size_t, size_t,
                 float*, size_t) {
  return false;
}
bool onednn_gemm_omp(const int8_t*, const float*, size_t, const int8_t*, const float*, size_t, size_t, size_t, float*,
                     size_t, int) {
  return false;
}

#endif

}  // namespace towers::simd
