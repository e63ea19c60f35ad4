// A prefill tile's attention, exact against int8 (simd/int8_attention.h): one KV head,
// 64 query heads (16 tokens of a GQA group of 4, as Forward::attention hands kv_attend), over n cached
// rows, F32 and F16 rows, single thread. Prints ns per (query, row) for exact attention, int8 scores
// with f32 sums, and int8 scores and sums (with their K/V blocks built beforehand, as
// Forward::attention builds them once per layer for every tile), the speed-ups, ns per row to build
// the blocks, and each int8 output's error against the exact one (max |x - exact| / max |exact|).
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
#include "simd/int8_attention.h"
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
              int8_attention_available() ? "on (AVX-512 VNNI)" : "unavailable (both columns exact)", kQueries, hd);
  std::printf("%-4s %5s | %8s %8s %8s | %5s %5s | %8s | %s\n", "fmt", "n", "exact", "scores", "int8", "x sc", "x int8",
              "build ns", "max |x - exact| / max |exact|: scores, int8");
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
      std::vector<Int8Values> vblocks(blocks.size());
      auto build = [&] {
        for (size_t b = 0; b < blocks.size(); ++b) {
          const int j0 = static_cast<int>(b) * kAttnBlock;
          int8_keys(q, k.data() + size_t(j0) * vb, vb, std::min(kAttnBlock, n - j0), hd, &blocks[b]);
          int8_values(q, v.data() + size_t(j0) * vb, vb, std::min(kAttnBlock, n - j0), hd, &vblocks[b]);
        }
      };
      build();
      // mode 0: exact, 1: int8 scores, 2: int8 scores and sums.
      auto run = [&](int mode, std::vector<float>& out) {
        std::fill(m.begin(), m.end(), -INFINITY);
        std::fill(l.begin(), l.end(), 0.0f);
        std::fill(acc.begin(), acc.end(), 0.0f);
        if (mode > 0) {
          kv_attend_int8(blocks.data(), mode == 2 ? vblocks.data() : nullptr, q, qv.data(), kQueries, v.data(), vb, n,
                         hd, scale, m.data(), l.data(), acc.data());
        } else {
          kv_attend(q, qv.data(), kQueries, k.data(), v.data(), vb, n, hd, scale, m.data(), l.data(), acc.data());
        }
        out.resize(acc.size());
        for (size_t i = 0; i < acc.size(); ++i) out[i] = acc[i] / l[i / hd];
      };
      std::vector<float> exact, scores, full;
      run(0, exact);
      run(1, scores);
      run(2, full);
      auto error = [&](const std::vector<float>& a) {
        double diff = 0, mag = 0;
        for (size_t i = 0; i < exact.size(); ++i) {
          diff = std::max(diff, double(std::fabs(a[i] - exact[i])));
          mag = std::max(mag, double(std::fabs(exact[i])));
        }
        return diff / mag;
      };
      std::vector<float> sink;
      const double te = towers::bench::best_seconds_per_call(secs, 15, [&] {
        run(0, sink);
        g_sink = sink[0];
      });
      const double ts = towers::bench::best_seconds_per_call(secs, 15, [&] {
        run(1, sink);
        g_sink = sink[0];
      });
      const double ti = towers::bench::best_seconds_per_call(secs, 15, [&] {
        run(2, sink);
        g_sink = sink[0];
      });
      const double tb = towers::bench::best_seconds_per_call(secs, 15, [&] {
        build();
        g_sink = blocks[0].mean[0];
      });
      const double per = double(kQueries) * n;
      std::printf("%-4s %5d | %8.3f %8.3f %8.3f | %5.2f %5.2f | %8.2f | %.2e %.2e\n", kv_quant_name(q), n,
                  te * 1e9 / per, ts * 1e9 / per, ti * 1e9 / per, te / ts, te / ti, tb * 1e9 / n, error(scores),
                  error(full));
      std::fflush(stdout);
    }
  }
  return 0;
}
