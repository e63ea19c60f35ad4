// oneDNN matmul vs our packed quantized kernels on Llama-3.2-1B prefill shapes (issue: "use oneDNN where
// it wins; decide by measurement"). Built only when oneDNN is installed (bench/CMakeLists.txt).
//
//   bench_onednn [reps=5] [M list=64,256,512] [threads list=1,2]
//   (oneDNN here uses OpenMP: its thread count is set with omp_set_num_threads; a 20 ms pause before
//   every timed call lets the idle workers of both runtimes go to sleep, so they do not compete.)
//
// Per weight shape K -> N (wq/wo 2048->2048, wk/wv 2048->512, gate/up 2048->8192, down 8192->2048),
// M tokens and T threads, the median / min / max seconds of one call (each path once per repetition,
// in turn, so load from other processes falls on all of them alike) of:
//   q4_0   our path: quantize_act of the M rows + gemm_packed on the Q4_0 packed matrix, split over a
//          ThreadPool in units of 16 rows (as Forward::matmuls does)
//   q4_k   the same with Q4_K
//   bf16p  oneDNN matmul bf16 x bf16 -> f32, weights pre-reordered once into oneDNN's own layout
//          (format any), i.e. bf16 weights cached: 4x the memory of Q4_0. Includes the f32 -> bf16
//          reorder of the activations.
//   bf16   the same with plain N x K bf16 weights (what a per-call dequantization would produce)
//   deq    dequantizing the whole Q4_0 matrix to plain bf16 (T threads), the per-call cost bf16 adds
//   s8     oneDNN matmul u8 x s8 -> f32 with per-output-channel scales, weights pre-reordered: a speed
//          ceiling only (Q4_0 has one scale per 32 weights along K, which this cannot express).
//          Includes the f32 -> u8 reorder of the activations.
// Then a whole-model estimate per path: 16 layers x (2 wq/wo + 2 wk/wv + 2 gate/up + 1 down) + the
// 128256 x 2048 output matrix for the last token only (our Q4_0 GEMV for every path): M / seconds.
// Attention, norms and activations are not included, so these are upper bounds of prefill tok/s.
#include <omp.h>

#include <algorithm>
#include <array>
#include <functional>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "bench/timing.h"
#include "engine/gguf/ggml_type.h"
#include "engine/gguf/quant.h"
#include "engine/base/thread_pool.h"
#include "simd/ops.h"
#include "simd/quant_dot.h"

using namespace towers;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

namespace {

using towers::bench::now_s;

struct Stat {
  double med = 0, lo = 0, hi = 0;
};
Stat stat_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

inline uint16_t to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Q4_0 rows (18-byte blocks: f16 d, 16 bytes of nibbles) -> bf16, element j of a block = d * (q_j - 8).
// A 16-entry table per block (faster here than converting every element; a production version would
// be a Highway kernel writing oneDNN's blocked layout directly).
__attribute__((target_clones("arch=skylake-avx512", "avx2", "default"))) void dequant_q4_0_bf16(
    const uint8_t* row, uint16_t* out, size_t K, const float* dtab) {
  static const float qv[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
  for (size_t b = 0; b < K / 32; ++b) {
    const uint8_t* blk = row + b * 18;
    uint16_t dh;
    std::memcpy(&dh, blk, 2);
    const float d = dtab[dh];
    uint16_t tab[16];  // the block's 16 possible values in bf16 (then one byte -> two table reads)
    for (int j = 0; j < 16; ++j) tab[j] = to_bf16(d * qv[j]);
    const uint8_t* qs = blk + 2;
    uint16_t* o = out + b * 32;
    for (int j = 0; j < 16; ++j) {
      o[j] = tab[qs[j] & 15];
      o[j + 16] = tab[qs[j] >> 4];
    }
  }
}

volatile float g_sink;

// Random quantized rows of one type: 64 distinct rows replicated (contents do not affect speed).
std::vector<uint8_t> random_rows(GgmlType t, size_t rows, size_t K, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t rb = row_bytes(t, K);
  std::vector<uint8_t> uniq(64 * rb), w(rows * rb);
  std::vector<float> src(K);
  for (size_t r = 0; r < 64; ++r) {
    for (auto& v : src) v = 0.05f * nd(rng);
    quantize_row(t, src.data(), uniq.data() + r * rb, K);
  }
  for (size_t r = 0; r < rows; ++r) std::memcpy(w.data() + r * rb, uniq.data() + (r % 64) * rb, rb);
  return w;
}

// Our path, as Forward::matmuls: quantize the M activation rows, then 16-row units over the pool.
struct Ours {
  uint32_t type;
  size_t N, K, stride, gb;
  std::vector<uint8_t> packed;
  std::vector<uint8_t> act_buf;
  uint8_t* act = nullptr;
  Ours(GgmlType t, const std::vector<uint8_t>& rows, size_t N_, size_t K_, size_t maxM)
      : type(static_cast<uint32_t>(t)), N(N_), K(K_) {
    gb = simd::packed_group_bytes(type, K);
    packed.resize(N / simd::kPackRows * gb);
    simd::pack_rows(type, rows.data(), row_bytes(t, K), N / simd::kPackRows, K, packed.data());
    stride = (simd::act_bytes(type, K) + 63) / 64 * 64;
    act_buf.resize(stride * maxM + 64);
    act = act_buf.data() + (64 - reinterpret_cast<uintptr_t>(act_buf.data()) % 64) % 64;
  }
  void run(ThreadPool& pool, const float* x, size_t M, float* y) {
    pool.parallel_for(M, [&](size_t t0, size_t t1, int) {
      for (size_t t = t0; t < t1; ++t) simd::quantize_act(type, x + t * K, act + t * stride, K);
    });
    pool.parallel_for(N / simd::kPackRows, [&](size_t g0, size_t g1, int) {
      simd::gemm_packed(type, packed.data() + g0 * gb, g1 - g0, act, stride, M, K, y + g0 * simd::kPackRows, N);
    });
  }
};

struct Env {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
};

// oneDNN matmul dst[M x N] f32 = src[M x K] (f32, reordered to bf16 or u8 inside the timed call) x W[K x N].
struct Dnnl {
  Env& env;
  size_t M, N, K;
  dnnl::memory src_f32, src_q, wei, dst;
  dnnl::reorder src_reorder;
  dnnl::matmul mm;
  std::string impl;
  // wei_plain: K x N weights stored N x K (format ba), data type wdt. prepack: let oneDNN pick the layout
  // (reordered once here, outside the timing).
  Dnnl(Env& e, size_t M_, size_t N_, size_t K_, dt sdt, dt wdt, void* wei_plain, bool prepack, const float* x,
       const std::vector<float>* oscales, float* y)
      : env(e), M(M_), N(N_), K(K_) {
    const dnnl::memory::dims sd{dnnl::memory::dim(M), dnnl::memory::dim(K)};
    const dnnl::memory::dims wd{dnnl::memory::dim(K), dnnl::memory::dim(N)};
    const dnnl::memory::dims dd{dnnl::memory::dim(M), dnnl::memory::dim(N)};
    dnnl::memory::desc src_md(sd, sdt, tag::ab), wei_plain_md(wd, wdt, tag::ba), dst_md(dd, dt::f32, tag::ab);
    dnnl::memory::desc wei_md = prepack ? dnnl::memory::desc(wd, wdt, tag::any) : wei_plain_md;
    dnnl::primitive_attr attr;
    if (oscales) attr.set_output_scales(1 << 1, *oscales);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), attr, env.eng);
    impl = pd.impl_info_str();
    dnnl::memory plain(wei_plain_md, env.eng, wei_plain);
    if (pd.weights_desc() != wei_plain_md) {
      wei = dnnl::memory(pd.weights_desc(), env.eng);
      dnnl::reorder(plain, wei).execute(env.strm, plain, wei);
      env.strm.wait();
    } else {
      wei = plain;
    }
    src_f32 = dnnl::memory({sd, dt::f32, tag::ab}, env.eng, const_cast<float*>(x));
    src_q = dnnl::memory(src_md, env.eng);
    dst = dnnl::memory(dst_md, env.eng, y);
    src_reorder = dnnl::reorder(src_f32, src_q);
    mm = dnnl::matmul(pd);
  }
  void run() {
    src_reorder.execute(env.strm, src_f32, src_q);
    mm.execute(env.strm, {{DNNL_ARG_SRC, src_q}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    env.strm.wait();
  }
};

struct Shape {
  const char* name;
  size_t K, N;
  int per_layer;
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(5, std::atoi(argv[1])) : 5;
  auto parse = [](const char* s) {
    std::vector<size_t> v;
    for (const char* p = s; *p;) {
      v.push_back(std::strtoul(p, const_cast<char**>(&p), 10));
      if (*p == ',') ++p;
    }
    return v;
  };
  const std::vector<size_t> Ms = parse(argc > 2 ? argv[2] : "64,256,512");
  const std::vector<size_t> Ts = parse(argc > 3 ? argv[3] : "1,2");
  const size_t maxM = *std::max_element(Ms.begin(), Ms.end());
  const Shape shapes[] = {{"wq/wo", 2048, 2048, 2}, {"wk/wv", 2048, 512, 2}, {"gate/up", 2048, 8192, 2},
                          {"down", 8192, 2048, 1}};
  const int n_layers = 16;
  const size_t vocab = 128256, dmodel = 2048;

  const dnnl::version_t* ver = dnnl::version();
  std::printf("oneDNN %d.%d.%d (%s), CPU runtime %s, effective ISA %s; Highway target %s; hw threads %u\n",
              ver->major, ver->minor, ver->patch, ver->hash,
              ver->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : ver->cpu_runtime == DNNL_RUNTIME_TBB ? "TBB"
              : ver->cpu_runtime == DNNL_RUNTIME_THREADPOOL ? "threadpool" : "other",
              isa_name(dnnl::get_effective_cpu_isa()), simd::target_name(), std::thread::hardware_concurrency());
  std::printf("reps %d (each path once per rep, in turn); times are one call: median [min..max]\n", reps);

  std::vector<float> dtab(65536);
  for (uint32_t h = 0; h < 65536; ++h) dtab[h] = fp16_to_f32(static_cast<uint16_t>(h));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(maxM * 8192);
  for (auto& v : x) v = nd(rng);

  // Per shape: the weights in every form (built once).
  struct Weights {
    std::vector<uint8_t> q40, q4k;
    std::vector<uint16_t> bf;  // dequantized Q4_0, N x K
    std::vector<int8_t> s8;    // N x K
    std::vector<float> sc;     // per output channel
  };
  std::vector<Weights> W(std::size(shapes));
  for (size_t s = 0; s < std::size(shapes); ++s) {
    const auto [name, K, N, per] = shapes[s];
    W[s].q40 = random_rows(GgmlType::Q4_0, N, K, rng);
    W[s].q4k = random_rows(GgmlType::Q4_K, N, K, rng);
    W[s].bf.resize(N * K);
    for (size_t r = 0; r < N; ++r) dequant_q4_0_bf16(W[s].q40.data() + r * row_bytes(GgmlType::Q4_0, K), W[s].bf.data() + r * K, K, dtab.data());
    W[s].s8.resize(N * K);
    for (size_t i = 0; i < N * K; ++i) W[s].s8[i] = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
    W[s].sc.assign(N, 1e-3f);
  }
  // Output matrix (last token only): our Q4_0 GEMV, the same for every path.
  std::vector<uint8_t> outw = random_rows(GgmlType::Q4_0, vocab, dmodel, rng);

  Env env;
  const char* paths[] = {"q4_0", "q4_k", "bf16p", "bf16", "deq", "s8"};
  constexpr int P = 6;
  // results[T][M][shape][path]
  std::map<size_t, std::map<size_t, std::vector<std::array<Stat, P>>>> res;
  std::map<size_t, Stat> out_t;

  bool checked = false;
  for (size_t T : Ts) {
    omp_set_num_threads(static_cast<int>(T));
    ThreadPool pool(static_cast<int>(T));
    std::printf("\n== T=%zu threads (ThreadPool %d, omp_get_max_threads %d)\n", T, pool.size(), omp_get_max_threads());
    {
      Ours o(GgmlType::Q4_0, outw, vocab, dmodel, 1);
      std::vector<float> y(vocab);
      std::vector<double> ts;
      o.run(pool, x.data(), 1, y.data());
      for (int r = 0; r < reps; ++r) {
        const double t0 = now_s();
        o.run(pool, x.data(), 1, y.data());
        ts.push_back(now_s() - t0);
      }
      out_t[T] = stat_of(ts);
      std::printf("output 128256x2048 Q4_0 GEMV (1 token): %.2f ms [%.2f..%.2f]\n", out_t[T].med * 1e3,
                  out_t[T].lo * 1e3, out_t[T].hi * 1e3);
    }
    std::printf("%-8s %4s | %-30s | %-30s | %-30s | %-30s | %-26s | %-30s\n", "shape", "M", "q4_0 ms  GFLOP/s",
                "q4_k", "bf16p (bf16 cached, dnnl layout)", "bf16 (plain NxK weights)", "deq Q4_0->bf16 ms", "s8 (u8 x s8)");
    for (size_t si = 0; si < std::size(shapes); ++si) {
      const auto [name, K, N, per] = shapes[si];
      Weights& w = W[si];
      Ours o40(GgmlType::Q4_0, w.q40, N, K, maxM), o4k(GgmlType::Q4_K, w.q4k, N, K, maxM);
      for (size_t M : Ms) {
        std::vector<float> y0(M * N), y1(M * N), y2(M * N), y3(M * N), y5(M * N);
        std::vector<uint16_t> deq(N * K);
        Dnnl bfp(env, M, N, K, dt::bf16, dt::bf16, w.bf.data(), true, x.data(), nullptr, y2.data());
        Dnnl bfl(env, M, N, K, dt::bf16, dt::bf16, w.bf.data(), false, x.data(), nullptr, y3.data());
        Dnnl s8(env, M, N, K, dt::u8, dt::s8, w.s8.data(), true, x.data(), &w.sc, y5.data());
        if (!checked) {
          std::printf("oneDNN implementations: bf16 cached '%s', bf16 plain '%s', int8 '%s'\n", bfp.impl.c_str(),
                      bfl.impl.c_str(), s8.impl.c_str());
        }
        const size_t rbq = row_bytes(GgmlType::Q4_0, K);
        auto dequant = [&] {
          pool.parallel_for(N, [&](size_t r0, size_t r1, int) {
            for (size_t r = r0; r < r1; ++r) dequant_q4_0_bf16(w.q40.data() + r * rbq, deq.data() + r * K, K, dtab.data());
          });
          g_sink = static_cast<float>(deq[0]);
        };
        std::function<void()> fns[P] = {[&] { o40.run(pool, x.data(), M, y0.data()); },
                                        [&] { o4k.run(pool, x.data(), M, y1.data()); },
                                        [&] { bfp.run(); },
                                        [&] { bfl.run(); },
                                        dequant,
                                        [&] { s8.run(); }};
        std::vector<double> ts[P];
        for (int p = 0; p < P; ++p) fns[p]();  // warm up
        for (int r = 0; r < reps; ++r) {
          for (int p = 0; p < P; ++p) {
            // Let the other runtime's spinning workers (OpenMP's, the ThreadPool's 200 us) go to sleep
            // first: with 2 threads on 2 cores they would otherwise steal the next path's core.
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            const double t0 = now_s();
            fns[p]();
            ts[p].push_back(now_s() - t0);
          }
        }
        std::array<Stat, P> st;
        for (int p = 0; p < P; ++p) st[p] = stat_of(ts[p]);
        res[T][M].push_back(st);
        const double gf = 2.0 * M * N * K / 1e9;
        auto cell = [&](int p) {
          char b[64];
          std::snprintf(b, sizeof b, "%7.2f %6.1f [%6.1f..%6.1f]", st[p].med * 1e3, gf / st[p].med, gf / st[p].hi,
                        gf / st[p].lo);
          return std::string(b);
        };
        char dq[64];
        std::snprintf(dq, sizeof dq, "%6.2f [%5.2f..%5.2f] %4.1fGB/s", st[4].med * 1e3, st[4].lo * 1e3, st[4].hi * 1e3,
                      (N * K * 2.5625) / st[4].med / 1e9);
        std::printf("%-8s %4zu | %s | %s | %s | %s | %s | %s\n", name, M, cell(0).c_str(), cell(1).c_str(),
                    cell(2).c_str(), cell(3).c_str(), dq, cell(5).c_str());

        if (!checked || M == Ms.front()) {
          // Same weights, same activations: our Q4_0 kernel (int8 activations), oneDNN bf16 (bf16 weights
          // and activations) and an f64 reference on the f32-dequantized Q4_0 weights and f32 activations.
          const size_t rows = std::min<size_t>(N, 256);
          std::vector<float> wr(K);
          double maxref = 0, e_ours = 0, e_bf = 0, e_ob = 0, ss_ref = 0, ss_ob = 0;
          for (size_t n = 0; n < rows; ++n) {
            dequantize_row(GgmlType::Q4_0, w.q40.data() + n * rbq, wr.data(), K);
            for (size_t m = 0; m < M; ++m) {
              double acc = 0;
              for (size_t k = 0; k < K; ++k) acc += double(wr[k]) * x[m * K + k];
              maxref = std::max(maxref, std::fabs(acc));
              const double a = y0[m * N + n], b = y2[m * N + n], c = y3[m * N + n];
              e_ours = std::max(e_ours, std::fabs(a - acc));
              e_bf = std::max({e_bf, std::fabs(b - acc), std::fabs(c - acc)});
              e_ob = std::max(e_ob, std::fabs(a - b));
              ss_ref += acc * acc;
              ss_ob += (a - b) * (a - b);
            }
          }
          // Relative to the largest |output|: elementwise relative error is meaningless near 0.
          const double tol = 2e-2;
          const bool ok = e_ob / maxref < tol;
          std::printf("  check %s M=%zu (%zu rows): max|err|/max|ref|: ours %.2e, oneDNN bf16 %.2e, ours vs oneDNN "
                      "%.2e (rms: %.2e) -> %s (tol %.0e)\n",
                      name, M, rows, e_ours / maxref, e_bf / maxref, e_ob / maxref, std::sqrt(ss_ob / ss_ref), ok ? "OK" : "MISMATCH", tol);
          if (!ok) return 1;
        }
        checked = true;
      }
    }
  }

  // Whole-model estimate: per path, 16 x sum over the 7 matrices + the output GEMV for the last token.
  std::printf("\nLlama-3.2-1B prefill estimate (matmuls only: 16 layers x 7 matrices + output for the last token),"
              " tok/s from median times [from max..min]:\n");
  std::printf("%2s %4s | %-20s | %-20s | %-20s | %-20s | %-20s | %-20s\n", "T", "M", "q4_0 (ours)", "q4_k (ours)",
              "bf16 cached", "bf16 plain + deq", "bf16 cached + deq", "s8 (ceiling)");
  for (size_t T : Ts) {
    for (size_t M : Ms) {
      const auto& v = res[T][M];
      // combos: index lists of paths summed
      const std::vector<std::vector<int>> combos = {{0}, {1}, {2}, {3, 4}, {2, 4}, {5}};
      std::string line;
      for (const auto& c : combos) {
        double t[3] = {out_t[T].med, out_t[T].lo, out_t[T].hi};
        for (size_t s = 0; s < std::size(shapes); ++s) {
          for (int p : c) {
            t[0] += n_layers * shapes[s].per_layer * v[s][p].med;
            t[1] += n_layers * shapes[s].per_layer * v[s][p].lo;
            t[2] += n_layers * shapes[s].per_layer * v[s][p].hi;
          }
        }
        char b[64];
        std::snprintf(b, sizeof b, "%6.1f [%5.1f..%5.1f]", M / t[0], M / t[2], M / t[1]);
        line += " | " + std::string(b);
      }
      std::printf("%2zu %4zu%s\n", T, M, line.c_str());
    }
  }
  std::printf("bench_onednn done: paths %s %s %s %s %s %s\n", paths[0], paths[1], paths[2], paths[3], paths[4], paths[5]);
  return 0;
}
