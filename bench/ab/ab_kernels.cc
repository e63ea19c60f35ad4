// In-process A/B of two versions of the simd/ kernels (see ab_kernels.sh): every case runs the old
// and the new version alternately, `reps` times, each timing a batch of calls in thread CPU time,
// and reports the best (least disturbed) time of each side and their ratio. Alternating inside one
// process keeps both sides under the same load, caches and clock, which separate processes on a
// shared VM do not. Also checks that both versions give the same bytes.
//   ab_kernels [reps] [ms_per_batch] [self]
// AB_ONLY=text in the environment times only the cases whose names contain it (outputs are compared
// for all).
// "self": the new version against itself, i.e. the bias of the harness (buffer placement, order).
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/ab/ab_api.h"
#include "engine/gguf/ggml_type.h"
#include "engine/gguf/quant.h"

using namespace towers;

namespace {

double cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

int g_reps = 15;
double g_batch_s = 0.004;
std::vector<double> g_ratios;
int g_mismatches = 0;

// Runs old() and new() alternately; prints the best seconds per call of each and old/new.
void compare(const std::string& name, const std::function<void()>& f_old, const std::function<void()>& f_new,
        double units, const char* unit) {
  static const char* only = std::getenv("AB_ONLY");
  if (only != nullptr && name.find(only) == std::string::npos) return;
  f_old();
  f_new();
  size_t calls = 1;
  for (double t0 = cpu_s(); cpu_s() - t0 < g_batch_s; ++calls) f_new();
  double best_old = 1e30, best_new = 1e30;
  for (int r = 0; r < g_reps; ++r) {
    for (int side = 0; side < 2; ++side) {
      const auto& f = side == 0 ? f_old : f_new;
      const double t0 = cpu_s();
      for (size_t c = 0; c < calls; ++c) f();
      const double per = (cpu_s() - t0) / static_cast<double>(calls);
      (side == 0 ? best_old : best_new) = std::min(side == 0 ? best_old : best_new, per);
    }
  }
  const double ratio = best_old / best_new;
  g_ratios.push_back(ratio);
  std::printf("%-44s old %9.2f  new %9.2f %-9s  old/new %.3f\n", name.c_str(), best_old / units * 1e9,
              best_new / units * 1e9, unit, ratio);
}

template <class T>
void same(const std::string& name, const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) != 0) {
    std::printf("MISMATCH: %s\n", name.c_str());
    ++g_mismatches;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_reps = std::atoi(argv[1]);
  if (argc > 2) g_batch_s = std::atof(argv[2]) / 1000;
  const bool self = argc > 3 && std::string(argv[3]) == "self";
  const ab::KernelApi O = self ? ab::new_api() : ab::old_api(), N = ab::new_api();
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::printf("in-process A/B%s, %d alternations of ~%.0f ms batches per side, thread CPU time, best of each\n",
              self ? " (self: new against new)" : "", g_reps, g_batch_s * 1000);

  const GgmlType types[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0,
                            GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
  const size_t n = 4096;
  for (GgmlType t : types) {
    const uint32_t id = static_cast<uint32_t>(t);
    const std::string tn(ggml_type_name(t));
    const size_t rb = row_bytes(t, n), rows = 256;
    std::vector<float> ws(rows * n);
    for (auto& v : ws) v = 0.05f * nd(rng);
    std::vector<uint8_t> w(rows * rb);
    for (size_t r = 0; r < rows; ++r) quantize_row(t, ws.data() + r * n, w.data() + r * rb, n);
    const size_t T = 8, as = (N.act_bytes(id, n) + 63) / 64 * 64;
    std::vector<float> x(T * n);
    for (auto& v : x) v = nd(rng);
    std::vector<uint8_t> act(T * as, 0), act_old(T * as, 0);
    for (size_t i = 0; i < T; ++i) {
      N.quantize_act(id, x.data() + i * n, act.data() + i * as, n);
      O.quantize_act(id, x.data() + i * n, act_old.data() + i * as, n);
    }
    same(tn + " quantize_act", act, act_old);
    compare(tn + " quantize_act", [&] { O.quantize_act(id, x.data(), act_old.data(), n); },
       [&] { N.quantize_act(id, x.data(), act.data(), n); }, 1, "ns/row");
    std::vector<float> yo(T * rows), yn(T * rows);
    for (size_t TT : {size_t{1}, T}) {
      const std::string sfx = " T=" + std::to_string(TT);
      const size_t r1 = TT == 1 ? 64 : rows;  // gemv: 64 rows stay in L2 (compute-bound)
      compare(tn + " gemm_q" + sfx, [&] { O.gemm_q(id, w.data(), rb, r1, act.data(), as, TT, n, yo.data(), rows); },
         [&] { N.gemm_q(id, w.data(), rb, r1, act.data(), as, TT, n, yn.data(), rows); }, double(r1 * TT), "ns/row/tok");
      same(tn + " gemm_q" + sfx, yo, yn);
    }
    if (N.packed_group_bytes(id, n) == 0) continue;
    const size_t groups = rows / 16, gb = N.packed_group_bytes(id, n);
    std::vector<uint8_t> po(groups * gb), pn(groups * gb);
    compare(tn + " pack_rows", [&] { O.pack_rows(id, w.data(), rb, groups, n, po.data()); },
       [&] { N.pack_rows(id, w.data(), rb, groups, n, pn.data()); }, double(rows), "ns/row");
    same(tn + " pack_rows", po, pn);
    for (size_t TT : {size_t{1}, T}) {
      const std::string sfx = " T=" + std::to_string(TT);
      const size_t g1 = TT == 1 ? 4 : groups;
      compare(tn + " gemm_packed" + sfx, [&] { O.gemm_packed(id, pn.data(), g1, act.data(), as, TT, n, yo.data(), rows); },
         [&] { N.gemm_packed(id, pn.data(), g1, act.data(), as, TT, n, yn.data(), rows); }, double(g1 * 16 * TT),
         "ns/row/tok");
      same(tn + " gemm_packed" + sfx, yo, yn);
    }
  }

  const char* fmt_names[] = {"f32", "f16", "q8", "q6", "q4"};
  for (int dim : {64, 128}) {
    for (int q = 0; q < 5; ++q) {
      const int nv = 4096;
      const size_t vb = N.kv_vec_bytes(q, dim);
      std::vector<uint8_t> cache(size_t(nv) * vb);
      std::vector<float> src(dim);
      for (int j = 0; j < nv; ++j) {
        for (auto& v : src) v = nd(rng);
        N.kv_quantize(q, src.data(), cache.data() + size_t(j) * vb, dim);
      }
      const std::string fn = std::string(fmt_names[q]) + " dim " + std::to_string(dim);
      for (int nq : {1, 4, 64}) {
        std::vector<float> qv(size_t(nq) * dim), so(size_t(nq) * nv), sn(size_t(nq) * nv), p(size_t(nq) * nv);
        for (auto& v : qv) v = nd(rng);
        for (auto& v : p) v = std::fabs(nd(rng)) / nv;
        const std::string g = " n_q=" + std::to_string(nq);
        compare(fn + " kv_dot" + g, [&] { O.kv_dot_group(q, qv.data(), nq, cache.data(), vb, nv, dim, so.data(), nv); },
           [&] { N.kv_dot_group(q, qv.data(), nq, cache.data(), vb, nv, dim, sn.data(), nv); }, double(nv), "ns/vec");
        same(fn + " kv_dot" + g, so, sn);
        std::vector<float> ao(size_t(nq) * dim, 0.f), an(size_t(nq) * dim, 0.f);
        compare(fn + " kv_accumulate" + g,
           [&] { O.kv_accumulate_group(q, p.data(), nv, nq, cache.data(), vb, nv, dim, ao.data()); },
           [&] { N.kv_accumulate_group(q, p.data(), nv, nq, cache.data(), vb, nv, dim, an.data()); }, double(nv),
           "ns/vec");
        std::fill(ao.begin(), ao.end(), 0.f);
        std::fill(an.begin(), an.end(), 0.f);
        O.kv_accumulate_group(q, p.data(), nv, nq, cache.data(), vb, nv, dim, ao.data());
        N.kv_accumulate_group(q, p.data(), nv, nq, cache.data(), vb, nv, dim, an.data());
        same(fn + " kv_accumulate" + g, ao, an);
      }
    }
  }
  // kv_attend as Forward::attention calls it: a prefill tile's query heads (16 tokens x 4 heads of one
  // KV head: 64) or a decode step's 4, over 2048 rows of one KV head in a layer of 8 KV heads.
  for (int q : {0, 1, 2, 4}) {
    for (int dim : {64, 128}) {
      const int nv = 2048, n_kv = 8;
      const size_t vb = N.kv_vec_bytes(q, dim), row = vb * n_kv;
      std::vector<uint8_t> k(size_t(nv) * row), v(size_t(nv) * row);
      std::vector<float> src(dim);
      for (int j = 0; j < nv; ++j) {
        for (int h = 0; h < n_kv; ++h) {
          for (auto& x : src) x = nd(rng);
          N.kv_quantize(q, src.data(), k.data() + size_t(j) * row + h * vb, dim);
          for (auto& x : src) x = nd(rng);
          N.kv_quantize(q, src.data(), v.data() + size_t(j) * row + h * vb, dim);
        }
      }
      for (int nq : {4, 64}) {
        std::vector<float> qv(size_t(nq) * dim);
        for (auto& x : qv) x = nd(rng);
        struct State {
          std::vector<float> m, l, acc;
        };
        auto run = [&](const ab::KernelApi& api, State& st) {
          st.m.assign(nq, -INFINITY);
          st.l.assign(nq, 0.f);
          st.acc.assign(size_t(nq) * dim, 0.f);
          api.kv_attend(q, qv.data(), nq, k.data(), v.data(), row, nv, dim, 0.125f, st.m.data(), st.l.data(),
                        st.acc.data());
        };
        State so, sn;
        const std::string name = std::string(fmt_names[q]) + " dim " + std::to_string(dim) + " kv_attend n_q=" +
                                 std::to_string(nq) + " n=" + std::to_string(nv);
        compare(name, [&] { run(O, so); }, [&] { run(N, sn); }, double(nv) * nq, "ns/score");
        run(O, so);
        run(N, sn);
        same(name + " acc", so.acc, sn.acc);
        same(name + " l", so.l, sn.l);
      }
    }
  }

  // A decode step at a long context: 4 query heads over 8192 rows of one KV head, rotating over 8
  // layers (256 MiB of f32 K and V: from DRAM, as decode reads them).
  for (int q : {0, 1}) {
    const int nv = 8192, n_kv = 8, dim = 64, layers = 8, nq = 4;
    const size_t vb = N.kv_vec_bytes(q, dim), row = vb * n_kv;
    std::vector<std::vector<uint8_t>> k(layers), v(layers);
    std::vector<float> src(dim);
    for (int L = 0; L < layers; ++L) {
      k[L].resize(size_t(nv) * row);
      v[L].resize(size_t(nv) * row);
      for (size_t j = 0; j < size_t(nv) * n_kv; ++j) {
        for (auto& x : src) x = nd(rng);
        N.kv_quantize(q, src.data(), k[L].data() + j * vb, dim);
        N.kv_quantize(q, src.data(), v[L].data() + j * vb, dim);
      }
    }
    std::vector<float> qv(size_t(nq) * dim);
    for (auto& x : qv) x = nd(rng);
    std::vector<float> m(nq), l(nq), acc(size_t(nq) * dim);
    int li = 0;
    auto run = [&](const ab::KernelApi& api) {
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.f);
      std::fill(acc.begin(), acc.end(), 0.f);
      api.kv_attend(q, qv.data(), nq, k[li].data(), v[li].data(), row, nv, dim, 0.125f, m.data(), l.data(),
                    acc.data());
      li = (li + 1) % layers;
    };
    compare(std::string(fmt_names[q]) + " dim 64 kv_attend n_q=4 n=8192 cold", [&] { run(O); }, [&] { run(N); },
            double(nv) * nq, "ns/score");
  }

  std::vector<double> r = g_ratios;
  std::sort(r.begin(), r.end());
  double lg = 0;
  for (double v : r) lg += std::log(v);
  std::printf("%zu cases: old/new geometric mean %.3f, median %.3f, min %.3f, max %.3f; output mismatches: %d\n",
              r.size(), std::exp(lg / r.size()), r[r.size() / 2], r.front(), r.back(), g_mismatches);
  return g_mismatches == 0 ? 0 : 1;
}
