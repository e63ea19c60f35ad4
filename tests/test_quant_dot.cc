// simd/quant_dot: quantized weight rows times quantized activations, against scalar references built
// from engine/quant's dequantizer; bit-identity across batch shapes and row splits; extreme inputs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>
// The quant_dot files also compile Highway's AVX3_DL target; so must the target lists here.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL 1
#endif
#include <hwy/targets.h>

#include "engine/gguf/ggml_type.h"
#include "engine/gguf/quant.h"
#include "simd/f16.h"
#include "simd/ops.h"
#include "simd/quant_dot.h"
#include "test_support.h"

using namespace towers;

namespace {

const GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                           GgmlType::IQ4_NL, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                           GgmlType::Q6_K, GgmlType::IQ4_XS};

uint32_t id(GgmlType t) { return static_cast<uint32_t>(t); }
size_t block_elems(GgmlType t) { return traits(t).block_elems; }
bool affine(GgmlType t) {
  return t == GgmlType::Q4_1 || t == GgmlType::Q5_1 || t == GgmlType::Q2_K || t == GgmlType::Q4_K ||
         t == GgmlType::Q5_K;
}
size_t act_block(GgmlType t) { return block_elems(t) == 256 ? 256 : 32; }

// Sizes per type: one block, an odd number of blocks, many blocks (crossing internal chunking).
std::vector<size_t> sizes_for(GgmlType t) {
  const size_t b = block_elems(t);
  if (b == 256) return {256, 3 * 256, 17 * 256};
  return {32, 7 * 32, 67 * 32, 4096};
}

struct Weights {
  size_t rows = 0, n = 0, stride = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // rows * n, dequantized with engine/quant (ggml's formulas)
  const uint8_t* row(size_t r) const { return bytes.data() + r * stride; }
};

// Quantizes src (rows x n) with quantize_row; rows are padded by 24 bytes to exercise row_stride.
Weights make_weights(GgmlType t, const std::vector<float>& src, size_t rows, size_t n) {
  Weights w;
  w.rows = rows;
  w.n = n;
  w.stride = row_bytes(t, n) + 24;
  w.bytes.assign(rows * w.stride, 0xA5);
  w.deq.resize(rows * n);
  for (size_t r = 0; r < rows; ++r) {
    quantize_row(t, src.data() + r * n, w.bytes.data() + r * w.stride, n);
    dequantize_row(t, w.bytes.data() + r * w.stride, w.deq.data() + r * n, n);
  }
  return w;
}

struct Acts {
  size_t T = 0, n = 0, stride = 0;
  std::vector<float> x;  // T * n originals
  std::vector<uint8_t> bytes;
};

Acts make_acts(GgmlType t, std::vector<float> x, size_t T, size_t n) {
  Acts a;
  a.T = T;
  a.n = n;
  a.stride = (simd::act_bytes(id(t), n) + 63) / 64 * 64;
  a.x = std::move(x);
  a.bytes.assign(T * a.stride + 64, 0);
  for (size_t i = 0; i < T; ++i)
    simd::quantize_act(id(t), a.x.data() + i * n, a.bytes.data() + i * a.stride, n);
  return a;
}

// Our activation layout (quant_dot.h), decoded: int16 q[n], then float d[n / block], then either
// float ds[nb] (A32) or int16 bsums[nb * 8], sums of 32 (A256).
struct ActView {
  const int16_t* q;
  const float* d;
  const float* ds;
  const int16_t* bs;
  const int8_t* q8;  // the same q as int8, after the per-block data
};
ActView view(GgmlType t, const uint8_t* p, size_t n) {
  const size_t nb = n / act_block(t);
  ActView v{};
  v.q = reinterpret_cast<const int16_t*>(p);
  v.d = reinterpret_cast<const float*>(p + 2 * n);
  if (act_block(t) == 32) {
    v.ds = v.d + nb;
    v.q8 = reinterpret_cast<const int8_t*>(p + 2 * n + 12 * nb);
  } else {
    v.bs = reinterpret_cast<const int16_t*>(p + 2 * n + 4 * nb);
    v.q8 = reinterpret_cast<const int8_t*>(p + 2 * n + 20 * nb);
  }
  return v;
}
std::vector<double> dequant_act(GgmlType t, const uint8_t* p, size_t n) {
  const ActView v = view(t, p, n);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<double>(v.d[i / act_block(t)]) * v.q[i];
  return out;
}

// When set, gemm() runs the packed (16-row interleaved) kernel: rows and r0 must be multiples of 16.
bool g_packed = false;

std::vector<float> gemm(GgmlType t, const Weights& w, const Acts& a, size_t r0, size_t rows, size_t t0,
                        size_t T) {
  std::vector<float> y(T * rows, std::nanf(""));
  if (g_packed) {
    REQUIRE(simd::has_packed(id(t)));
    REQUIRE(rows % simd::kPackRows == 0);
    REQUIRE(r0 % simd::kPackRows == 0);
    const size_t groups = rows / simd::kPackRows;
    std::vector<uint8_t> packed(groups * simd::packed_group_bytes(id(t), w.n) + 1, 0x5A);
    simd::pack_rows(id(t), w.row(r0), w.stride, groups, w.n, packed.data() + 1);  // unaligned on purpose
    CHECK(packed[0] == 0x5A);
    simd::gemm_packed(id(t), packed.data() + 1, groups, a.bytes.data() + t0 * a.stride, a.stride, T, w.n,
                      y.data(), rows);
    return y;
  }
  simd::gemm_q(id(t), w.row(r0), w.stride, rows, a.bytes.data() + t0 * a.stride, a.stride, T, w.n,
               y.data(), rows);
  return y;
}

// Checks (a) against sum dequant(w) * dequant_act(x) in double and (b) against the float dot of
// dequant(w) with the unquantized x, within the activation-quantization bound.
void check_against_references(GgmlType t, const Weights& w, const Acts& a) {
  const size_t n = w.n;
  const auto y = gemm(t, w, a, 0, w.rows, 0, a.T);
  const size_t B = act_block(t);
  for (size_t ti = 0; ti < a.T; ++ti) {
    const uint8_t* ap = a.bytes.data() + ti * a.stride;
    const auto xa = dequant_act(t, ap, n);
    const ActView v = view(t, ap, n);
    const float* x = a.x.data() + ti * n;
    const int32_t* sums = B == 32 ? reinterpret_cast<const int32_t*>(v.ds + n / 32) : nullptr;
    for (size_t r = 0; r < w.rows; ++r) {
      const float* wr = w.deq.data() + r * n;
      double ref = 0, mag = 0, bound = 0, mag_x = 0;
      for (size_t i = 0; i < n; ++i) {
        ref += static_cast<double>(wr[i]) * xa[i];
        // Affine types (x = d*q + m) sum d*q and m separately, so rounding scales with |m| too;
        // the smallest weight of the 32-element sub-block is that m.
        const double offs = affine(t) ? std::fabs(*std::min_element(wr + i / 32 * 32, wr + i / 32 * 32 + 32)) : 0.0;
        mag += (std::fabs(static_cast<double>(wr[i])) + offs) * std::fabs(xa[i]);
        mag_x += std::fabs(static_cast<double>(wr[i]) * x[i]);
        // |x - d*q| <= d/2 (plus rounding of x * 127/amax), per element; A32's d is the f32 one
        // rounded to f16 (relative error <= 2^-11).
        bound += std::fabs(static_cast<double>(wr[i])) * (0.5 * (1 + 5e-4) + 5e-4 * std::abs(v.q[i])) * v.d[i / B];
      }
      // A32's min term is m * ds with ds = f16(d32 * sum), not m * (d * sum): the reference does the same.
      for (size_t b = 0; sums && affine(t) && b < n / 32; ++b) {
        const double m = *std::min_element(wr + 32 * b, wr + 32 * b + 32);
        const double diff = m * (static_cast<double>(v.ds[b]) - static_cast<double>(v.d[b]) * sums[b]);
        ref += diff;
        bound += std::fabs(diff);
      }
      const float got = y[ti * w.rows + r];
      CAPTURE(ggml_type_name(t));
      CAPTURE(n);
      CAPTURE(r);
      CAPTURE(ti);
      CAPTURE(ref);
      CAPTURE(got);
      // (a) same math, different rounding only.
      CHECK(std::fabs(got - ref) <= 1e-5 * mag + 1e-30);
      // (b) against the unquantized activations.
      const float fdot = simd::dot_f32(wr, x, n);
      CHECK(std::fabs(static_cast<double>(got) - fdot) <= bound * (1 + 1e-4) + 2e-5 * (mag + mag_x) + 1e-30);
    }
  }
}

std::vector<float> randn(std::mt19937& rng, size_t count, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(count);
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace

TEST_CASE("quant_dot: API basics") {
  for (GgmlType t : kTypes) {
    CHECK(simd::has_quant_dot(id(t)));
    const size_t n = 4 * 256;
    const size_t nb = n / act_block(t);
    CHECK(simd::act_bytes(id(t), n) == 3 * n + (act_block(t) == 32 ? 12 * nb : 52 * nb));
    CHECK(simd::has_packed(id(t)) == (t == GgmlType::Q4_0 || t == GgmlType::Q8_0 || t == GgmlType::Q4_K ||
                                      t == GgmlType::Q6_K || t == GgmlType::IQ4_NL || t == GgmlType::IQ4_XS ||
                                      t == GgmlType::Q2_K || t == GgmlType::Q3_K || t == GgmlType::Q5_K ||
                                      t == GgmlType::Q4_1 || t == GgmlType::Q5_0 || t == GgmlType::Q5_1));
    // Q4_K's packed blocks hold the 8 scales and 8 mins as bytes: 148 bytes per row and block, not 144;
    // Q5_K's too (180, not 176); IQ4_XS's its 8 scales: 138, not 136; Q3_K's its 16 scales: 114, not 110.
    const size_t extra_per_block = t == GgmlType::Q4_K || t == GgmlType::Q5_K ? 4
                                   : t == GgmlType::IQ4_XS ? 2
                                   : t == GgmlType::Q3_K   ? 4
                                                           : 0;
    const size_t extra = 16 * extra_per_block * (n / 256);
    if (simd::has_packed(id(t))) CHECK(simd::packed_group_bytes(id(t), n) == 16 * row_bytes(t, n) + extra);
  }
  CHECK_FALSE(simd::has_quant_dot(0));
  CHECK_FALSE(simd::has_quant_dot(1));
  CHECK_FALSE(simd::has_quant_dot(id(GgmlType::Q8_1)));
  CHECK_FALSE(simd::has_quant_dot(id(GgmlType::IQ2_XXS)));
  CHECK_FALSE(simd::has_quant_dot(id(GgmlType::TQ2_0)));
  MESSAGE("Highway target: " << std::string(simd::target_name())
                               << ", quant_dot: " << std::string(simd::quant_dot_target()));
}

TEST_CASE("quant_dot: activation layout") {
  std::mt19937 rng(7);
  for (GgmlType t : kTypes) {
    for (size_t n : sizes_for(t)) {
      auto x = randn(rng, n, 3.0f);
      x[n / 2] = -40.f;
      if (n >= 3 * 32) {  // blocks whose scale is beyond f16's normal range: tiny, and huge
        for (size_t i = 32; i < 64; ++i) x[i] *= 1e-5f;
        x[70] = 3e7f;
      }
      const Acts a = make_acts(t, x, 1, n);
      const ActView v = view(t, a.bytes.data(), n);
      // The same row with the f32 scales of older records: the same q, the unrounded d and ds.
      std::vector<uint8_t> f32_bytes(simd::act_bytes(id(t), n) + 64);
      simd::quantize_act(id(t), x.data(), f32_bytes.data(), n, simd::ActScales::F32);
      const ActView v32 = view(t, f32_bytes.data(), n);
      const size_t B = act_block(t), nb = n / B;
      CHECK(std::memcmp(v.q, v32.q, 2 * n) == 0);
      CHECK(std::memcmp(v.q8, v32.q8, n) == 0);
      // f16 where it holds the value to 11 bits; elsewhere (ggml's block would be lost) the f32 one.
      auto f16 = [](float f) {
        return std::fabs(f) >= 0x1p-14f && std::fabs(f) <= 65504.0f ? simd::fp16_to_f32(simd::f32_to_fp16(f)) : f;
      };
      for (size_t b = 0; b < nb; ++b) {
        float amax = 0;
        for (size_t i = 0; i < B; ++i) amax = std::max(amax, std::fabs(x[b * B + i]));
        const float d = amax / 127.0f;
        CHECK(v32.d[b] == d);
        CHECK(v.d[b] == (B == 32 ? f16(d) : d));  // ggml's block_q8_0 / q8_1 hold an f16 d; block_q8_K f32
        int32_t sum = 0;
        for (size_t i = 0; i < B; ++i) {
          const int q = v.q[b * B + i];
          CHECK(q >= -127);
          CHECK(q <= 127);
          CHECK(std::fabs(x[b * B + i] - d * q) <= d * 0.5001f);
          CHECK(v.q8[b * B + i] == q);
          sum += q;
        }
        if (B == 32) {
          CHECK(v32.ds[b] == d * static_cast<float>(sum));
          CHECK(v.ds[b] == f16(d * static_cast<float>(sum)));  // block_q8_1's s: f16(d * sum), d unrounded
          CHECK(reinterpret_cast<const int32_t*>(v.ds + nb)[b] == sum);
        } else {
          for (size_t g = 0; g < 8; ++g) {
            int32_t s32 = 0;
            for (size_t i = 0; i < 32; ++i) s32 += v.q[b * B + 32 * g + i];
            CHECK(v.bs[b * 8 + g] == s32);
          }
        }
      }
    }
  }
}

TEST_CASE("quant_dot: one activation layout per family") {
  std::mt19937 rng(3);
  const size_t n = 3 * 256;
  const auto x = randn(rng, n);
  auto bytes = [&](GgmlType t) {
    std::vector<uint8_t> a(simd::act_bytes(id(t), n));
    simd::quantize_act(id(t), x.data(), a.data(), n);
    return a;
  };
  CHECK(bytes(GgmlType::Q4_K) == bytes(GgmlType::Q6_K));
  CHECK(bytes(GgmlType::Q5_K) == bytes(GgmlType::Q6_K));
  CHECK(bytes(GgmlType::Q4_0) == bytes(GgmlType::Q8_0));
  CHECK(bytes(GgmlType::Q4_1) == bytes(GgmlType::Q5_0));
  // A256's tail: the int8 copy of q, then the exact sums of each run of 16 (Q6_K's VNNI offsets).
  const auto a = bytes(GgmlType::Q6_K);
  const size_t nb = n / 256;
  const auto* q = reinterpret_cast<const int16_t*>(a.data());
  const auto* q8 = reinterpret_cast<const int8_t*>(a.data() + 2 * n + 20 * nb);
  for (size_t i = 0; i < n; ++i) REQUIRE(q8[i] == q[i]);
  for (size_t h = 0; h < n / 16; ++h) {
    int sum = 0;
    for (size_t i = 0; i < 16; ++i) sum += q[16 * h + i];
    int16_t bs16;
    std::memcpy(&bs16, a.data() + 3 * n + 20 * nb + 2 * h, 2);
    CHECK(bs16 == sum);
  }
}

TEST_CASE("quant_dot: matches the scalar references") {
  std::mt19937 rng(1234);
  for (GgmlType t : kTypes) {
    for (size_t n : sizes_for(t)) {
      const size_t rows = 7, T = 5;
      auto ws = randn(rng, rows * n, 0.05f);
      // Rows of different magnitude and a biased row (exercises Q4_1/Q4_K mins).
      for (size_t i = 0; i < n; ++i) {
        ws[1 * n + i] *= 40.f;
        ws[2 * n + i] += 0.03f;
      }
      const Weights w = make_weights(t, ws, rows, n);
      auto xs = randn(rng, T * n, 1.0f);
      for (size_t i = 0; i < n; ++i) xs[3 * n + i] = std::fabs(xs[3 * n + i]) + 0.5f;  // one-signed row
      const Acts a = make_acts(t, xs, T, n);
      check_against_references(t, w, a);
    }
  }
}

TEST_CASE("quant_dot: bit-identical whatever the batch shape and row split") {
  std::mt19937 rng(99);
  for (GgmlType t : kTypes) {
    const size_t n = block_elems(t) == 256 ? 17 * 256 : 67 * 32;
    const size_t rows = 9, T = 5;
    const Weights w = make_weights(t, randn(rng, rows * n, 0.1f), rows, n);
    const Acts a = make_acts(t, randn(rng, T * n), T, n);
    CAPTURE(ggml_type_name(t));
    const auto all = gemm(t, w, a, 0, rows, 0, T);
    // T = 1, one activation row at a time.
    for (size_t ti = 0; ti < T; ++ti) {
      const auto one = gemm(t, w, a, 0, rows, ti, 1);
      CHECK(std::memcmp(one.data(), all.data() + ti * rows, rows * sizeof(float)) == 0);
    }
    // T = 2 and 3 (other remainders of the groups of 4).
    const auto two = gemm(t, w, a, 0, rows, 3, 2);
    CHECK(std::memcmp(two.data(), all.data() + 3 * rows, 2 * rows * sizeof(float)) == 0);
    const auto three = gemm(t, w, a, 0, rows, 1, 3);
    CHECK(std::memcmp(three.data(), all.data() + 1 * rows, 3 * rows * sizeof(float)) == 0);
    // Rows split as threads would split them.
    for (size_t split : {1, 4, 8}) {
      const auto lo = gemm(t, w, a, 0, split, 0, T);
      const auto hi = gemm(t, w, a, split, rows - split, 0, T);
      for (size_t ti = 0; ti < T; ++ti) {
        CHECK(std::memcmp(lo.data() + ti * split, all.data() + ti * rows, split * sizeof(float)) == 0);
        CHECK(std::memcmp(hi.data() + ti * (rows - split), all.data() + ti * rows + split,
                          (rows - split) * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("quant_dot: large T (tiled path) equals T = 1") {
  std::mt19937 rng(5);
  for (GgmlType t : kTypes) {
    const size_t n = 8192, rows = 6, T = 51;  // T * act_bytes > the internal tile budget
    CAPTURE(ggml_type_name(t));
    const Weights w = make_weights(t, randn(rng, rows * n, 0.1f), rows, n);
    const Acts a = make_acts(t, randn(rng, T * n), T, n);
    REQUIRE(T * a.stride > 512 * 1024);
    const auto all = gemm(t, w, a, 0, rows, 0, T);
    for (size_t ti = 0; ti < T; ++ti) {
      const auto one = gemm(t, w, a, 0, rows, ti, 1);
      CHECK(std::memcmp(one.data(), all.data() + ti * rows, rows * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("quant_dot: extreme inputs") {
  std::mt19937 rng(42);
  for (GgmlType t : kTypes) {
    for (size_t n : sizes_for(t)) {
      CAPTURE(ggml_type_name(t));
      CAPTURE(n);
      const size_t rows = 5;
      auto ws = randn(rng, rows * n, 0.2f);
      std::fill(ws.begin() + 4 * n, ws.end(), 0.f);  // an all-zero weight row
      ws[n + n / 3] = 25.f;                          // a weight outlier
      const Weights w = make_weights(t, ws, rows, n);

      std::vector<float> xs(4 * n, 0.f);  // row 0: all zero
      for (size_t i = 0; i < n; ++i) {
        xs[n + i] = std::normal_distribution<float>(0.f, 1.f)(rng);         // row 1: outlier
        xs[2 * n + i] = -std::fabs(std::normal_distribution<float>(0.f, 1.f)(rng)) - 0.1f;  // negative
        xs[3 * n + i] = std::normal_distribution<float>(0.f, 1e-3f)(rng);  // tiny, with a huge value
      }
      xs[n + n / 2] = 1e6f;
      xs[3 * n + 7] = -3e30f;
      // A block of values too small to quantize (amax < 1e-30, including subnormals): it becomes 0.
      const size_t B = act_block(t);
      if (n >= 2 * B)
        for (size_t i = B; i < 2 * B; ++i) xs[3 * n + i] = (i % 3 ? 1e-33f : -1e-40f);
      const Acts a = make_acts(t, xs, 4, n);
      const auto y = gemm(t, w, a, 0, rows, 0, 4);
      for (size_t r = 0; r < rows; ++r) CHECK(y[r] == 0.f);               // zero activations
      for (size_t ti = 0; ti < 4; ++ti) CHECK(y[ti * rows + 4] == 0.f);   // zero weights
      for (float v : y) CHECK(std::isfinite(v));
      check_against_references(t, w, a);
    }
  }
}

// Every Highway target compiled in and runnable here (e.g. AVX2, SSE4, SSSE3, EMU128 on an AVX2
// machine): same reference checks and batch-shape bit-identity, so lane counts 8 and 16 (and the
// emulated ops) are all exercised.
TEST_CASE("quant_dot: every compiled target") {
  std::mt19937 rng(77);
  towers::test::for_each_target([&](int64_t target) {
    CHECK(std::string(simd::quant_dot_target()) == hwy::TargetName(target));
    for (GgmlType t : kTypes) {
      const std::string type_name(ggml_type_name(t));
      CAPTURE(type_name);
      const size_t n = block_elems(t) == 256 ? 3 * 256 : 67 * 32;
      const size_t rows = 5, T = 5;
      auto ws = randn(rng, rows * n, 0.1f);
      for (size_t i = 0; i < n; ++i) ws[2 * n + i] += 0.05f;
      const Weights w = make_weights(t, ws, rows, n);
      const Acts a = make_acts(t, randn(rng, T * n), T, n);
      check_against_references(t, w, a);
      const auto all = gemm(t, w, a, 0, rows, 0, T);
      for (size_t ti = 0; ti < T; ++ti) {
        const auto one = gemm(t, w, a, 0, rows, ti, 1);
        CHECK(std::memcmp(one.data(), all.data() + ti * rows, rows * sizeof(float)) == 0);
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Packed (16-row interleaved) kernels: every type of gemm_q.
namespace {
const GgmlType kPackedTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,   GgmlType::Q5_1,
                                 GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,   GgmlType::Q4_K,
                                 GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};
struct PackedScope {
  PackedScope() { g_packed = true; }
  ~PackedScope() { g_packed = false; }
};
}  // namespace

namespace {
// Element e of packed row r (of one group), dequantized from the layout documented in quant_dot.h
// with ggml's float operations; blk points at the packed block of that element.
float f16_at(const uint8_t* p) { return fp16_to_f32(static_cast<uint16_t>(p[0] | p[1] << 8)); }
float packed_element(GgmlType t, const uint8_t* blk, size_t r, size_t e) {
  const size_t R = simd::kPackRows;
  const float d = f16_at(blk + 2 * r);
  switch (t) {
    case GgmlType::Q4_0: {  // chunk p = (e % 16) / 2 holds quant bytes 2p, 2p+1 of each row
      const uint8_t byte = blk[2 * R + 32 * ((e % 16) / 2) + 2 * r + e % 2];
      return static_cast<float>((e < 16 ? byte & 15 : byte >> 4) - 8) * d;
    }
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1: {  // m at 2R (Q4_1, Q5_1), the fifth-bit planes, then Q4_0's chunks
      const size_t qs = t == GgmlType::Q4_1 ? 4 * R : t == GgmlType::Q5_0 ? 6 * R : 8 * R;
      const size_t qh = t == GgmlType::Q5_1 ? 4 * R : 2 * R;
      const size_t i = e % 16, p = i / 2, k = i % 2;
      const uint8_t byte = blk[qs + 32 * p + 2 * r + k];
      int q = e < 16 ? byte & 15 : byte >> 4;
      if (t != GgmlType::Q4_1) q |= ((blk[qh + 32 * (e / 16) + 2 * r + k] >> p) & 1) << 4;
      if (t == GgmlType::Q5_0) return static_cast<float>(q - 16) * d;
      return d * static_cast<float>(q) + f16_at(blk + 2 * R + 2 * r);
    }
    case GgmlType::Q8_0:
      return static_cast<float>(static_cast<int8_t>(blk[2 * R + 32 * (e / 2) + 2 * r + e % 2])) * d;
    case GgmlType::IQ4_NL: {  // Q4_0's chunks, nibbles into the codebook
      const uint8_t byte = blk[2 * R + 32 * ((e % 16) / 2) + 2 * r + e % 2];
      return d * static_cast<float>(simd::kIq4nlValues[e < 16 ? byte & 15 : byte >> 4]);
    }
    case GgmlType::Q2_K:
    case GgmlType::Q3_K: {  // sub-block sb = e / 16 = 8h + 2j + k: bits 2j of quant chunk 16h + 8k + i / 2
      const size_t sb = e / 16, h = sb / 8, j = sb % 8 / 2, k = sb % 2, i = e % 16;
      const size_t quants = t == GgmlType::Q2_K ? 20 * R : 18 * R;
      int q = (blk[quants + 32 * (16 * h + 8 * k + i / 2) + 2 * r + i % 2] >> (2 * j)) & 3;
      if (t == GgmlType::Q2_K) {  // scale byte (scale | min << 4) at 4R, dmin at 2R
        const uint8_t sc = blk[4 * R + R * sb + r];
        const float dmin = f16_at(blk + 2 * R + 2 * r);
        return d * static_cast<float>(sc & 15) * static_cast<float>(q) - dmin * static_cast<float>(sc >> 4);
      }
      // Q3_K: int8 scales at 2R; the third bit is bit 4h + j of hmask chunk 8k + i / 2 (at 82R)
      q |= ((blk[82 * R + 32 * (8 * k + i / 2) + 2 * r + i % 2] >> (4 * h + j)) & 1) << 2;
      const int8_t sc = static_cast<int8_t>(blk[2 * R + R * sb + r]);
      return d * static_cast<float>(sc) * static_cast<float>(q - 4);
    }
    case GgmlType::IQ4_XS: {  // int8 scales[8][16], then per sub-block j IQ4_NL's chunks
      const size_t j = e / 32, i = e % 32;
      const int8_t sc = static_cast<int8_t>(blk[2 * R + R * j + r]);
      const uint8_t byte = blk[10 * R + 256 * j + 32 * ((i % 16) / 2) + 2 * r + i % 2];
      return d * static_cast<float>(sc) * static_cast<float>(simd::kIq4nlValues[i < 16 ? byte & 15 : byte >> 4]);
    }
    case GgmlType::Q6_K: {  // group g of 16 elements: 4 chunks of low nibbles, 2 of top bits
      const size_t g = e / 16, i = e % 16, hi = i / 8, p = (i % 8) / 2, k = i % 2;
      const int8_t sc = static_cast<int8_t>(blk[2 * R + 16 * g + r]);
      const uint8_t* grp = blk + 2 * R + 16 * R + 192 * g;
      const int lo4 = (grp[32 * p + 2 * r + k] >> (4 * hi)) & 15;
      const int top2 = (grp[128 + 32 * (p / 2) + 2 * r + k] >> (4 * (p % 2) + 2 * hi)) & 3;
      return d * static_cast<float>(sc) * static_cast<float>((lo4 | top2 << 4) - 32);
    }
    default: {  // Q4_K, Q5_K: sub-block j = e / 32; part c = e / 64 holds quant bytes 32c + 2p + k
      const size_t j = e / 32, c = e / 64, i = e % 32, p = i / 2, k = i % 2;
      const float dmin = f16_at(blk + 2 * R + 2 * r);
      const uint8_t sc = blk[4 * R + R * j + r], mn = blk[12 * R + 32 * (j / 2) + 2 * r + j % 2];
      const uint8_t byte = blk[20 * R + 512 * c + 32 * p + 2 * r + k];
      int q = j % 2 ? byte >> 4 : byte & 15;
      if (t == GgmlType::Q5_K) q |= ((blk[148 * R + 32 * p + 2 * r + k] >> j) & 1) << 4;  // qh chunk p, bit j
      return d * static_cast<float>(sc) * static_cast<float>(q) - dmin * static_cast<float>(mn);
    }
  }
}
}  // namespace

// pack_rows on its own (gemm_packed is tested through it below): every element of every row, read
// back from the packed bytes as quant_dot.h documents them, is the ggml row's element, bit for bit.
TEST_CASE("quant_dot packed: pack_rows writes the documented layout") {
  std::mt19937 rng(97);
  for (GgmlType t : kPackedTypes) {
    CAPTURE(ggml_type_name(t));
    const size_t n = 3 * 256, rows = 32, groups = rows / simd::kPackRows, nb = n / block_elems(t);
    auto ws = randn(rng, rows * n, 0.05f);
    for (size_t i = 0; i < n; ++i) ws[7 * n + i] += 0.03f;  // a row with non-zero mins
    const Weights w = make_weights(t, ws, rows, n);
    const size_t gb = simd::packed_group_bytes(id(t), n);
    REQUIRE(gb % nb == 0);
    std::vector<uint8_t> packed(groups * gb);
    simd::pack_rows(id(t), w.row(0), w.stride, groups, n, packed.data());
    size_t mismatches = 0;
    for (size_t g = 0; g < groups; ++g) {
      for (size_t r = 0; r < simd::kPackRows; ++r) {
        for (size_t e = 0; e < n; ++e) {
          const size_t b = e / block_elems(t);
          const uint8_t* blk = packed.data() + g * gb + b * (gb / nb);
          const float got = packed_element(t, blk, r, e % block_elems(t));
          const float want = w.deq[(g * simd::kPackRows + r) * n + e];
          mismatches += std::memcmp(&got, &want, sizeof(float)) != 0;
        }
      }
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("quant_dot packed: matches the scalar references") {
  PackedScope scope;
  std::mt19937 rng(4321);
  for (GgmlType t : kPackedTypes) {
    for (size_t n : sizes_for(t)) {
      const size_t rows = 32, T = 6;
      auto ws = randn(rng, rows * n, 0.05f);
      for (size_t i = 0; i < n; ++i) {
        ws[1 * n + i] *= 40.f;
        ws[17 * n + i] += 0.03f;
      }
      const Weights w = make_weights(t, ws, rows, n);
      auto xs = randn(rng, T * n, 1.0f);
      for (size_t i = 0; i < n; ++i) xs[3 * n + i] = std::fabs(xs[3 * n + i]) + 0.5f;
      const Acts a = make_acts(t, xs, T, n);
      check_against_references(t, w, a);
    }
  }
}

TEST_CASE("quant_dot packed: agrees with gemm_q") {
  std::mt19937 rng(2468);
  for (GgmlType t : kPackedTypes) {
    CAPTURE(ggml_type_name(t));
    const size_t n = block_elems(t) == 256 ? 11 * 256 : 83 * 32, rows = 32, T = 6;
    auto ws = randn(rng, rows * n, 0.05f);
    for (size_t i = 0; i < n; ++i) ws[5 * n + i] += 0.04f;  // a row with large mins (affine types)
    const Weights w = make_weights(t, ws, rows, n);
    const Acts a = make_acts(t, randn(rng, T * n), T, n);
    const auto plain = gemm(t, w, a, 0, rows, 0, T);
    std::vector<float> packed;
    {
      PackedScope scope;
      packed = gemm(t, w, a, 0, rows, 0, T);
    }
    for (size_t ti = 0; ti < T; ++ti) {
      const auto xa = dequant_act(t, a.bytes.data() + ti * a.stride, n);
      for (size_t r = 0; r < rows; ++r) {
        // Both are exact integer sums per block, rounded differently in f32: bounded by the
        // magnitude of the terms (affine types: plus the sub-block minimum, summed separately).
        const float* wr = w.deq.data() + r * n;
        double mag = 0;
        for (size_t i = 0; i < n; ++i) {
          const double offs = affine(t) ? std::fabs(*std::min_element(wr + i / 32 * 32, wr + i / 32 * 32 + 32)) : 0.0;
          mag += (std::fabs(static_cast<double>(wr[i])) + offs) * std::fabs(xa[i]);
        }
        CAPTURE(r);
        CAPTURE(ti);
        CHECK(std::fabs(static_cast<double>(packed[ti * rows + r]) - plain[ti * rows + r]) <= 2e-5 * mag + 1e-30);
      }
    }
  }
}

TEST_CASE("quant_dot packed: bit-identical whatever the batch shape and group split") {
  PackedScope scope;
  std::mt19937 rng(98);
  for (GgmlType t : kPackedTypes) {
    CAPTURE(ggml_type_name(t));
    const size_t n = block_elems(t) == 256 ? 9 * 256 : 67 * 32, rows = 48, T = 7;
    const Weights w = make_weights(t, randn(rng, rows * n, 0.1f), rows, n);
    const Acts a = make_acts(t, randn(rng, T * n), T, n);
    const auto all = gemm(t, w, a, 0, rows, 0, T);
    for (size_t ti = 0; ti < T; ++ti) {
      const auto one = gemm(t, w, a, 0, rows, ti, 1);
      CHECK(std::memcmp(one.data(), all.data() + ti * rows, rows * sizeof(float)) == 0);
    }
    const auto three = gemm(t, w, a, 0, rows, 2, 3);
    CHECK(std::memcmp(three.data(), all.data() + 2 * rows, 3 * rows * sizeof(float)) == 0);
    for (size_t split : {16, 32}) {
      const auto lo = gemm(t, w, a, 0, split, 0, T);
      const auto hi = gemm(t, w, a, split, rows - split, 0, T);
      for (size_t ti = 0; ti < T; ++ti) {
        CHECK(std::memcmp(lo.data() + ti * split, all.data() + ti * rows, split * sizeof(float)) == 0);
        CHECK(std::memcmp(hi.data() + ti * (rows - split), all.data() + ti * rows + split,
                          (rows - split) * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("quant_dot packed: large T (tiled path) equals T = 1") {
  PackedScope scope;
  std::mt19937 rng(6);
  for (GgmlType t : kPackedTypes) {
    const size_t n = 8192, rows = 16, T = 37;
    CAPTURE(ggml_type_name(t));
    const Weights w = make_weights(t, randn(rng, rows * n, 0.1f), rows, n);
    const Acts a = make_acts(t, randn(rng, T * n), T, n);
    REQUIRE(T * a.stride > 256 * 1024);
    const auto all = gemm(t, w, a, 0, rows, 0, T);
    for (size_t ti = 0; ti < T; ++ti) {
      const auto one = gemm(t, w, a, 0, rows, ti, 1);
      CHECK(std::memcmp(one.data(), all.data() + ti * rows, rows * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("quant_dot packed: extreme inputs") {
  PackedScope scope;
  std::mt19937 rng(43);
  for (GgmlType t : kPackedTypes) {
    for (size_t n : sizes_for(t)) {
      CAPTURE(ggml_type_name(t));
      CAPTURE(n);
      const size_t rows = 16;
      auto ws = randn(rng, rows * n, 0.2f);
      std::fill(ws.begin() + 4 * n, ws.begin() + 5 * n, 0.f);  // an all-zero weight row
      ws[n + n / 3] = 25.f;
      const Weights w = make_weights(t, ws, rows, n);
      std::vector<float> xs(4 * n, 0.f);
      for (size_t i = 0; i < n; ++i) {
        xs[n + i] = std::normal_distribution<float>(0.f, 1.f)(rng);
        xs[2 * n + i] = -std::fabs(std::normal_distribution<float>(0.f, 1.f)(rng)) - 0.1f;
        xs[3 * n + i] = std::normal_distribution<float>(0.f, 1e-3f)(rng);
      }
      xs[n + n / 2] = 1e6f;
      xs[3 * n + 7] = -3e30f;
      const Acts a = make_acts(t, xs, 4, n);
      const auto y = gemm(t, w, a, 0, rows, 0, 4);
      for (size_t r = 0; r < rows; ++r) CHECK(y[r] == 0.f);
      for (size_t ti = 0; ti < 4; ++ti) CHECK(y[ti * rows + 4] == 0.f);
      for (float v : y) CHECK(std::isfinite(v));
      check_against_references(t, w, a);
    }
  }
}

TEST_CASE("quant_dot packed: every compiled target") {
  PackedScope scope;
  std::mt19937 rng(78);
  towers::test::for_each_target([&](int64_t target) {
    CHECK(std::string(simd::quant_dot_target()) == hwy::TargetName(target));
    for (GgmlType t : kPackedTypes) {
      const size_t n = block_elems(t) == 256 ? 3 * 256 : 67 * 32, rows = 32, T = 5;
      const Weights w = make_weights(t, randn(rng, rows * n, 0.1f), rows, n);
      const Acts a = make_acts(t, randn(rng, T * n), T, n);
      check_against_references(t, w, a);
      const auto all = gemm(t, w, a, 0, rows, 0, T);
      for (size_t ti = 0; ti < T; ++ti) {
        const auto one = gemm(t, w, a, 0, rows, ti, 1);
        CHECK(std::memcmp(one.data(), all.data() + ti * rows, rows * sizeof(float)) == 0);
      }
    }
  });
}

// Weights and activations at the kernels' edges: row 7 with large mins / positive offsets, row 20
// with saturated codes, token 4 with every activation rounding to -127.. (the rest random).
struct EdgeCase {
  Weights w;
  Acts a;
};
EdgeCase make_edge_case(std::mt19937& rng, GgmlType t, size_t rows, size_t n, size_t T) {
  auto ws = randn(rng, rows * n, 0.1f);
  for (size_t i = 0; i < n; ++i) ws[7 * n + i] += 0.05f;
  for (size_t i = 0; i < n; ++i) ws[20 * n + i] *= 30.f;
  auto xs = randn(rng, T * n);
  for (size_t i = 0; i < n; ++i) xs[4 * n + i] = -std::fabs(xs[4 * n + i]) - 0.2f;
  return {make_weights(t, ws, rows, n), make_acts(t, xs, T, n)};
}

// AVX3 and AVX3_DL (VNNI) have the same lane count: the packed results must be the same bits, for
// every T (1..8 tokens per unpacked block, tiles) and group split. Also against AVX2 (8-row slices,
// 4 tokens per block), which has FMA too and so the same per-(row, token) arithmetic (SSE4 has no
// FMA: its MulAdd rounds twice).
TEST_CASE("quant_dot packed: bit-identical across x86 targets") {
  PackedScope scope;
  std::mt19937 rng(1234);
  std::vector<int64_t> targets;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if (target == HWY_AVX3_DL || target == HWY_AVX3 || target == HWY_AVX2) {
      targets.push_back(target);
    }
  }
  if (targets.size() < 2) {
    MESSAGE("fewer than two of AVX3_DL/AVX3/AVX2 supported here: nothing to compare");
    return;
  }
  for (GgmlType t : kPackedTypes) {
    CAPTURE(ggml_type_name(t));
    const size_t n = block_elems(t) == 256 ? 5 * 256 : 37 * 32, rows = 48, T = 19;
    const EdgeCase edge = make_edge_case(rng, t, rows, n, T);
    const Weights& w = edge.w;
    const Acts& a = edge.a;
    std::vector<std::vector<float>> per;
    for (int64_t target : targets) {
      hwy::SetSupportedTargetsForTest(target);
      CAPTURE(std::string(simd::quant_dot_target()));
      REQUIRE(std::string(simd::quant_dot_target()) == hwy::TargetName(target));
      per.push_back(gemm(t, w, a, 0, rows, 0, T));
      // Within a target: T = 1 and a group split give the same bits.
      for (size_t ti : {size_t{0}, size_t{9}, T - 1}) {
        const auto one = gemm(t, w, a, 16, 32, ti, 1);
        CHECK(std::memcmp(one.data(), per.back().data() + ti * rows + 16, 32 * sizeof(float)) == 0);
      }
    }
    hwy::SetSupportedTargetsForTest(0);
    for (size_t k = 1; k < per.size(); ++k) {
      CAPTURE(hwy::TargetName(targets[0]));
      CAPTURE(hwy::TargetName(targets[k]));
      CHECK(std::memcmp(per[0].data(), per[k].data(), per[0].size() * sizeof(float)) == 0);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// aarch64 with the Armv8.2 dot product: Highway's NEON target sums with sdot (gemm_packed_sdot-inl.h)
// or, turned off, with the int16 madd kernels of every other target: the same integers, so the
// same bits, for every T (1..4 tokens per unpacked block, tiles) and group split. qemu-aarch64's
// default CPU has dotprod, so the ARM64 leg of CI runs this (scripts/test-arm64.sh).
TEST_CASE("quant_dot packed: NEON with and without sdot") {
  PackedScope scope;
  struct Restore {
    ~Restore() {
      simd::set_packed_dotprod(true);
      hwy::SetSupportedTargetsForTest(0);
    }
  } restore;
  simd::set_packed_dotprod(true);
  bool neon = false;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) neon = neon || target == HWY_NEON;
  if (!neon || !simd::dotprod_enabled()) {
    CHECK_FALSE(simd::packed_dotprod());
    MESSAGE("not an aarch64 CPU with the dot product: no sdot kernels to compare");
    return;
  }
  hwy::SetSupportedTargetsForTest(HWY_NEON);
  REQUIRE(std::string(simd::quant_dot_target()) == hwy::TargetName(HWY_NEON));
  REQUIRE(simd::packed_dotprod());
  std::mt19937 rng(4321);
  for (GgmlType t : kPackedTypes) {
    const std::string type_name(ggml_type_name(t));
    CAPTURE(type_name);
    const size_t n = block_elems(t) == 256 ? 3 * 256 : 37 * 32, rows = 48, T = 11;
    const EdgeCase edge = make_edge_case(rng, t, rows, n, T);
    const Weights& w = edge.w;
    const Acts& a = edge.a;
    simd::set_packed_dotprod(true);
    const auto with_sdot = gemm(t, w, a, 0, rows, 0, T);
    check_against_references(t, w, a);
    simd::set_packed_dotprod(false);
    REQUIRE_FALSE(simd::packed_dotprod());
    const auto without = gemm(t, w, a, 0, rows, 0, T);
    CHECK(std::memcmp(with_sdot.data(), without.data(), with_sdot.size() * sizeof(float)) == 0);
    simd::set_packed_dotprod(true);
    for (size_t ti : {size_t{0}, size_t{5}, T - 1}) {
      const auto one = gemm(t, w, a, 16, 32, ti, 1);
      CHECK(std::memcmp(one.data(), with_sdot.data() + ti * rows + 16, 32 * sizeof(float)) == 0);
    }
  }
}
