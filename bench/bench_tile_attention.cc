// A prefill tile's attention, exact scores against int8 scores (simd/int8_scores.h): one KV head,
// 64 query heads (16 tokens of a GQA group of 4, as Forward::attention hands kv_attend), over n cached
// rows, F32 and F16 keys, single thread. Prints ns per (query, row) for each (int8: with its key
// blocks built beforehand, as Forward::attention builds them once per layer for every tile), their
// ratio, ns per row to build the key blocks, and the int8 output's error against the exact one
// (max |int8 - exact| / max |exact| over the outputs).
// Keys are "outlier" keys: Gaussian plus a per-channel offset, 4 channels of 8 with offsets of +-6
// (the shape of real models' RoPE'd K), so that the int8 path's centring is exercised.
//   bench_tile_attention [seconds_per_measurement] [head_dim]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench/timing.h"
#include "simd/attention.h"
#include "simd/int8_scores.h"
#include "simd/kv_quant.h"
#include "simd/ops.h"

using namespace towers::simd;

namespace {
volatile float g_sink;
}

int main(int argc, char** argv) {
  const double secs = argc > 1 ? std::atof(argv[1]) : 0.5;
  const int hd = argc > 2 ? std::atoi(argv[2]) : 64;
  constexpr int kQueries = 64;
  std::printf("Highway target: %s; int8 scores %s; %d queries x one KV head, head_dim %d, 1 thread\n", target_name(),
              int8_scores_available() ? "on (AVX-512 VNNI)" : "unavailable (both columns exact)", kQueries, hd);
  std::printf("%-4s %5s | %10s %10s %6s | %10s | %s\n", "fmt", "n", "exact ns", "int8 ns", "x", "keys ns",
              "max |int8 - exact| / max |exact|");
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> qv(size_t(kQueries) * hd), offset(hd);
  for (float& x : qv) x = nd(rng);
  for (int e = 0; e < hd; ++e) offset[e] = e % 8 < 4 ? 0.0f : (e % 2 ? 6.0f : -6.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (KvQuant q : {KvQuant::F32, KvQuant::F16}) {
    for (int n : {512, 2048, 4096}) {
      const size_t vb = kv_vec_bytes(q, hd);
      std::vector<uint8_t> k(vb * n), v(vb * n);
      std::vector<float> x(hd);
      for (int r = 0; r < n; ++r) {
        for (int e = 0; e < hd; ++e) x[e] = nd(rng) + offset[e];
        kv_quantize(q, x.data(), k.data() + r * vb, hd);
        for (float& e : x) e = nd(rng);
        kv_quantize(q, x.data(), v.data() + r * vb, hd);
      }
      std::vector<float> m(kQueries), l(kQueries), acc(size_t(kQueries) * hd);
      // The int8 key blocks, built once (as Forward::attention builds them once per layer for all tiles).
      std::vector<Int8Keys> blocks((n + kAttnBlock - 1) / kAttnBlock);
      auto build = [&] {
        for (size_t b = 0; b < blocks.size(); ++b) {
          const int j0 = static_cast<int>(b) * kAttnBlock;
          int8_keys(q, k.data() + size_t(j0) * vb, vb, std::min(kAttnBlock, n - j0), hd, &blocks[b]);
        }
      };
      build();
      auto run = [&](bool int8, std::vector<float>& out) {
        std::fill(m.begin(), m.end(), -INFINITY);
        std::fill(l.begin(), l.end(), 0.0f);
        std::fill(acc.begin(), acc.end(), 0.0f);
        if (int8) {
          kv_attend_int8(blocks.data(), q, qv.data(), kQueries, v.data(), vb, n, hd, scale, m.data(), l.data(), acc.data());
        } else {
          kv_attend(q, qv.data(), kQueries, k.data(), v.data(), vb, n, hd, scale, m.data(), l.data(), acc.data());
        }
        out.resize(acc.size());
        for (size_t i = 0; i < acc.size(); ++i) out[i] = acc[i] / l[i / hd];
      };
      std::vector<float> exact, int8;
      run(false, exact);
      run(true, int8);
      double diff = 0, mag = 0;
      for (size_t i = 0; i < exact.size(); ++i) {
        diff = std::max(diff, double(std::fabs(int8[i] - exact[i])));
        mag = std::max(mag, double(std::fabs(exact[i])));
      }
      std::vector<float> sink;
      const double te = towers::bench::best_seconds_per_call(secs, 15, [&] {
        run(false, sink);
        g_sink = sink[0];
      });
      const double ti = towers::bench::best_seconds_per_call(secs, 15, [&] {
        run(true, sink);
        g_sink = sink[0];
      });
      const double tb = towers::bench::best_seconds_per_call(secs, 15, [&] {
        build();
        g_sink = blocks[0].mean[0];
      });
      const double per = double(kQueries) * n;
      std::printf("%-4s %5d | %10.3f %10.3f %6.2f | %10.2f | %.2e\n", kv_quant_name(q), n, te * 1e9 / per, ti * 1e9 / per,
                  te / ti, tb * 1e9 / n, diff / mag);
      std::fflush(stdout);
    }
  }
  return 0;
}
