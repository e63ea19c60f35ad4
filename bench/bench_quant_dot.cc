// Quantized GEMV/GEMM kernels (simd/quant_dot) against the reference path (dequantize a row to f32,
// then dot_f32), single-threaded, on a 2048 x 8192 weight matrix of each type.
//   bench_quant_dot [seconds_per_measurement] [noavx3dl]
// ("noavx3dl": disable Highway's AVX3_DL target, i.e. run quant_dot's AVX3 code without VNNI.)
// "hot": the same matrix every call (it may stay in L3); "cold": rotating over copies that together
// exceed 64 MiB, so weights stream from DRAM.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <hwy/targets.h>

#include "bench/timing.h"
#include "engine/gguf/ggml_type.h"
#include "engine/gguf/quant.h"
#include "simd/ops.h"
#include "simd/quant_dot.h"

using namespace towers;

namespace {

using towers::bench::now_s;

// Runs fn(iteration) repeatedly for at least `secs`; returns the best seconds per call of 5 rounds
// (the best round is the least disturbed by other processes on a shared machine).
template <class Fn>
double time_it(double secs, Fn&& fn) {
  fn(0);  // warm up
  std::vector<double> per;
  size_t it = 1;
  for (int round = 0; round < 5; ++round) {
    size_t calls = 0;
    const double t0 = now_s();
    double t1 = t0;
    while (t1 - t0 < secs / 5 || calls == 0) {
      fn(it++);
      ++calls;
      t1 = now_s();
    }
    per.push_back((t1 - t0) / static_cast<double>(calls));
  }
  return *std::min_element(per.begin(), per.end());
}

volatile float g_sink;

}  // namespace

int main(int argc, char** argv) {
  const double secs = argc > 1 ? std::atof(argv[1]) : 1.0;
  if (argc > 2 && std::string(argv[2]) == "noavx3dl") hwy::DisableTargets(HWY_AVX3_DL);
  const size_t rows = 2048, n = 8192, T8 = 8;
  // Each newer type after the nearest older one (Q5_1 after Q5_0, IQ4_NL after Q4_0, Q2_K/Q3_K/IQ4_XS
  // after Q4_K).
  const GgmlType types[] = {GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                            GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::IQ4_XS, GgmlType::Q3_K, GgmlType::Q2_K,
                            GgmlType::Q5_K, GgmlType::Q6_K};
  std::printf("Highway target: %s (quant_dot: %s)   matrix %zu x %zu, 1 thread, %.1f s per measurement\n",
              simd::target_name(), simd::quant_dot_target(), rows, n, secs);
  std::printf("%-5s %8s | %-27s | %-27s | %-17s | %-21s | %s\n", "type", "MiB", "gemv T=1 hot",
              "gemv T=1 cold", "ref T=1 hot", "gemm T=8 hot", "quantize_act");
  std::printf("%-5s %8s | %8s %8s %8s | %8s %8s %8s | %8s %8s | %8s %12s | %s\n", "", "", "GB/s",
              "ns/row", "xref", "GB/s", "ns/row", "xref", "GB/s", "ns/row", "ns/row", "ns/row/tok",
              "us/row-of-n");

  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(T8 * n);
  for (auto& v : x) v = nd(rng);

  for (GgmlType t : types) {
    const uint32_t tid = static_cast<uint32_t>(t);
    const size_t rb = row_bytes(t, n);
    const size_t mat = rows * rb;
    // 64 distinct quantized rows, replicated (contents do not affect speed).
    std::vector<uint8_t> uniq(64 * rb);
    {
      std::vector<float> src(n);
      for (size_t r = 0; r < 64; ++r) {
        for (auto& v : src) v = 0.05f * nd(rng);
        quantize_row(t, src.data(), uniq.data() + r * rb, n);
      }
    }
    const size_t copies = std::max<size_t>(2, (64u << 20) / mat + 1);
    std::vector<uint8_t> w(copies * mat);
    for (size_t r = 0; r < copies * rows; ++r) std::memcpy(w.data() + r * rb, uniq.data() + (r % 64) * rb, rb);

    const size_t ab = simd::act_bytes(tid, n);
    const size_t as = (ab + 63) / 64 * 64;
    std::vector<uint8_t> act(T8 * as + 64);
    for (size_t i = 0; i < T8; ++i) simd::quantize_act(tid, x.data() + i * n, act.data() + i * as, n);
    std::vector<float> y(T8 * rows);

    const double t_hot = time_it(secs, [&](size_t) {
      simd::gemm_q(tid, w.data(), rb, rows, act.data(), as, 1, n, y.data(), rows);
      g_sink = y[0];
    });
    // 64 rows only: the weights stay in L2, so this is the kernel's compute-bound rate.
    const size_t l2rows = 64;
    const double t_l2 = time_it(secs, [&](size_t) {
      simd::gemm_q(tid, w.data(), rb, l2rows, act.data(), as, 1, n, y.data(), rows);
      g_sink = y[0];
    });
    const double t_cold = time_it(secs, [&](size_t it) {
      simd::gemm_q(tid, w.data() + (it % copies) * mat, rb, rows, act.data(), as, 1, n, y.data(), rows);
      g_sink = y[0];
    });
    std::vector<float> tmp(n);
    const double t_ref = time_it(secs, [&](size_t) {
      for (size_t r = 0; r < rows; ++r) {
        dequantize_row(t, w.data() + r * rb, tmp.data(), n);
        y[r] = simd::dot_f32(tmp.data(), x.data(), n);
      }
      g_sink = y[0];
    });
    const double t_ref8 = time_it(secs, [&](size_t) {
      for (size_t r = 0; r < rows; ++r) {
        dequantize_row(t, w.data() + r * rb, tmp.data(), n);
        for (size_t i = 0; i < T8; ++i) y[i * rows + r] = simd::dot_f32(tmp.data(), x.data() + i * n, n);
      }
      g_sink = y[0];
    });
    const double t_8 = time_it(secs, [&](size_t) {
      simd::gemm_q(tid, w.data(), rb, rows, act.data(), as, T8, n, y.data(), rows);
      g_sink = y[0];
    });
    const double t_q = time_it(secs / 4, [&](size_t it) {
      simd::quantize_act(tid, x.data() + (it % T8) * n, act.data(), n);
      g_sink = static_cast<float>(act[0]);
    });
    const double gb = static_cast<double>(mat) / 1e9;
    std::printf("%-6s %7.2f | %8.2f %8.1f %7.2fx | %8.2f %8.1f %7.2fx | %8.2f %8.1f | %8.1f %12.1f | %.2f\n",
                std::string(ggml_type_name(t)).c_str(), mat / 1048576.0, gb / t_hot, t_hot / rows * 1e9,
                t_ref / t_hot, gb / t_cold, t_cold / rows * 1e9, t_ref / t_cold, gb / t_ref,
                t_ref / rows * 1e9, t_8 / rows * 1e9, t_8 / rows / T8 * 1e9, t_q * 1e6);
    std::printf("%-5s          L2-resident (64 rows): %.2f GB/s, %.1f ns/row\n", "", static_cast<double>(l2rows * rb) / 1e9 / t_l2, t_l2 / l2rows * 1e9);
    if (simd::has_packed(tid)) {
      // The packed (16-row interleaved) layout of the same matrices.
      const size_t groups = rows / simd::kPackRows, pm = groups * simd::packed_group_bytes(tid, n);
      std::vector<uint8_t> pw(copies * pm);
      for (size_t c = 0; c < copies; ++c) simd::pack_rows(tid, w.data() + c * mat, rb, groups, n, pw.data() + c * pm);
      const double p_hot = time_it(secs, [&](size_t) {
        simd::gemm_packed(tid, pw.data(), groups, act.data(), as, 1, n, y.data(), rows);
        g_sink = y[0];
      });
      const double p_l2 = time_it(secs, [&](size_t) {
        simd::gemm_packed(tid, pw.data(), l2rows / simd::kPackRows, act.data(), as, 1, n, y.data(), rows);
        g_sink = y[0];
      });
      const double p_cold = time_it(secs, [&](size_t it) {
        simd::gemm_packed(tid, pw.data() + (it % copies) * pm, groups, act.data(), as, 1, n, y.data(), rows);
        g_sink = y[0];
      });
      const double p_8 = time_it(secs, [&](size_t) {
        simd::gemm_packed(tid, pw.data(), groups, act.data(), as, T8, n, y.data(), rows);
        g_sink = y[0];
      });
      std::printf("%-5s packed: gemv hot %.2f GB/s, L2 %.2f GB/s, cold %.2f GB/s (%.2fx gemm_q cold); "
                  "T=8 %.1f ns/row/tok (%.2fx gemm_q T=8)\n", "", gb / p_hot,
                  static_cast<double>(l2rows * rb) / 1e9 / p_l2, gb / p_cold, t_cold / p_cold,
                  p_8 / rows / T8 * 1e9, t_8 / p_8);
    }
    std::printf("%-5s          T=8: %.2fx faster than ref T=8 (%.1f ns/row), %.2fx the per-token cost of T=1\n", "",
                t_ref8 / t_8, t_ref8 / rows * 1e9, (t_8 / T8) / t_hot);
  }
  return 0;
}
