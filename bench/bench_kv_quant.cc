// Quantized KV-cache kernels (simd/kv_quant): ns per scored vector (kv_dot_many) and per accumulated
// vector (kv_accumulate) for every format at head sizes 64 and 128, n = 4096 vectors (one KV head of a
// 4096-token context, vectors contiguous), single thread; also quantize cost and round-trip error.
// "hot": the same 4096 vectors every call (they stay in L2/L3); "cold": rotating over copies that
// together exceed 256 MiB, so the cache streams from DRAM as it does with many sessions.
//   bench_kv_quant [seconds_per_measurement]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench/timing.h"
#include "simd/kv_quant.h"
#include "simd/ops.h"

using namespace towers::simd;

namespace {

template <class Fn>
double time_it(double secs, Fn&& fn) {
  return towers::bench::best_seconds_per_call(secs, 25, fn);
}

volatile float g_sink;

// Relative RMS error of quantize -> dequantize over `count` vectors (outliers: channels e % 64 == 5
// are 10x larger).
double rel_rms(KvQuant q, int dim, bool outliers, int count) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(dim), y(dim);
  std::vector<uint8_t> buf(kv_vec_bytes(q, dim));
  double e2 = 0, x2 = 0;
  for (int t = 0; t < count; ++t) {
    for (int i = 0; i < dim; ++i) x[i] = nd(rng) * (outliers && i % 64 == 5 ? 10.f : 1.f);
    kv_quantize(q, x.data(), buf.data(), dim);
    kv_dequantize(q, buf.data(), y.data(), dim);
    for (int i = 0; i < dim; ++i) {
      e2 += double(y[i] - x[i]) * (y[i] - x[i]);
      x2 += double(x[i]) * x[i];
    }
  }
  return std::sqrt(e2 / x2);
}

}  // namespace

int main(int argc, char** argv) {
  const double secs = argc > 1 ? std::atof(argv[1]) : 1.0;
  const int n = 4096;
  const KvQuant formats[] = {KvQuant::F32, KvQuant::F16, KvQuant::Q8, KvQuant::Q6, KvQuant::Q4};
  std::printf("Highway target: %s   n = %d vectors, 1 thread, %.1f s per measurement\n", target_name(), n, secs);
  std::printf("%-4s %4s %6s | %-25s | %-25s | %-17s | %-17s | %s\n", "", "", "", "dot hot", "acc hot", "dot cold",
              "acc cold", "");
  std::printf("%-4s %4s %6s | %8s %7s %7s | %8s %7s %7s | %8s %7s | %8s %7s | %s\n", "fmt", "dim", "B/vec", "ns/vec",
              "GB/s", "x f32", "ns/vec", "GB/s", "x f32", "ns/vec", "x f32", "ns/vec", "x f32", "quantize ns/vec");
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int dim : {64, 128}) {
    std::vector<float> src(size_t(n) * dim), qv(dim), p(n), scores(n), acc(dim);
    for (auto& v : src) v = nd(rng);
    for (auto& v : qv) v = nd(rng);
    for (auto& v : p) v = std::abs(nd(rng)) / n;
    double f32[4] = {0, 0, 0, 0};
    for (KvQuant q : formats) {
      const size_t vb = kv_vec_bytes(q, dim), bytes = size_t(n) * vb;
      const size_t copies = std::max<size_t>(2, (size_t(256) << 20) / bytes);
      std::vector<uint8_t> cache(copies * bytes);
      for (int j = 0; j < n; ++j) kv_quantize(q, &src[size_t(j) * dim], &cache[size_t(j) * vb], dim);
      for (size_t c = 1; c < copies; ++c) std::copy(cache.begin(), cache.begin() + bytes, cache.begin() + c * bytes);
      size_t next = 0;
      const auto at = [&](bool cold) { return cache.data() + (cold ? (next++ % copies) * bytes : 0); };
      double t[4];  // dot hot, acc hot, dot cold, acc cold
      for (int m = 0; m < 4; ++m) {
        const bool cold = m >= 2;
        if (m % 2 == 0) {
          t[m] = time_it(secs, [&] {
            kv_dot_many(q, qv.data(), at(cold), vb, n, dim, scores.data());
            g_sink = scores[n - 1];
          });
        } else {
          t[m] = time_it(secs, [&] {
            kv_accumulate(q, p.data(), at(cold), vb, n, dim, acc.data());
            g_sink = acc[0];
          });
        }
        t[m] *= 1e9 / n;
      }
      std::vector<uint8_t> one(vb);
      const int nq = 1024;
      const double tq = time_it(secs / 4, [&] {
        for (int j = 0; j < nq; ++j) kv_quantize(q, &src[size_t(j) * dim], one.data(), dim);
        g_sink = static_cast<float>(one[0]);
      });
      if (q == KvQuant::F32) std::copy(t, t + 4, f32);
      std::printf("%-4s %4d %6zu | %8.2f %7.1f %7.2f | %8.2f %7.1f %7.2f | %8.2f %7.2f | %8.2f %7.2f | %9.1f\n",
                  kv_quant_name(q), dim, vb, t[0], double(vb) / t[0], f32[0] / t[0], t[1], double(vb) / t[1],
                  f32[1] / t[1], t[2], f32[2] / t[2], t[3], f32[3] / t[3], tq * 1e9 / nq);
    }
  }
  std::printf("(x f32: speed relative to the F32 format, > 1 is faster; GB/s: vector bytes read per second)\n\n");

  std::printf("round-trip relative RMS error (20000 vectors; outliers: channels e %% 64 == 5 are 10x)\n");
  std::printf("%-4s | %21s | %21s | %21s\n", "fmt", "dim 8 gauss / outl", "dim 64 gauss / outl", "dim 128 gauss / outl");
  for (KvQuant q : formats) {
    std::printf("%-4s", kv_quant_name(q));
    for (int dim : {8, 64, 128}) {
      std::printf(" | %9.3e / %9.3e", rel_rms(q, dim, false, 20000), rel_rms(q, dim, true, 20000));
    }
    std::printf("\n");
  }
  return 0;
}
