// Q2_K, Q3_K, Q5_1, IQ4_NL and IQ4_XS against llama.cpp itself: blocks written by ggml's
// quantize_row_*_ref (and blocks of random bytes), with the floats ggml's dequantize_row_* made of them,
// in tests/reference/quants/ (README.md there: the llama.cpp commit and the commands). Our
// dequantize_row must give the same bits; gemm_q (and gemm_packed where the type has it) must match
// the f32 dot of ggml's floats with the activations within the activation-quantization bound; and our
// own quantizer must write blocks whose error is close to ggml's on the same rows (Q5_1: the same bytes).
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/gguf/ggml_type.h"
#include "engine/gguf/quant.h"
#include "simd/ops.h"
#include "simd/quant_dot.h"

using namespace towers;

namespace {

constexpr size_t kN = 256;       // elements per row
constexpr size_t kRows = 6;      // rows 0..3 quantized by ggml, rows 4..5 random bytes
constexpr size_t kQuantRows = 4;

std::vector<uint8_t> read_file(const std::string& name) {
  const std::string path = std::string(TOWERS_QUANT_REFERENCE_DIR) + "/" + name;
  std::ifstream f(path, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot open " << path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::vector<float> read_floats(const std::string& name, size_t count) {
  const auto bytes = read_file(name);
  REQUIRE(bytes.size() == count * sizeof(float));
  std::vector<float> v(count);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

const GgmlType kTypes[] = {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q5_1, GgmlType::IQ4_NL, GgmlType::IQ4_XS};

struct Reference {
  std::vector<uint8_t> blocks;  // kRows rows of row_bytes(t, kN)
  std::vector<float> floats;    // ggml's dequantized rows
};

Reference load(GgmlType t) {
  const std::string name(ggml_type_name(t));
  Reference r{read_file(name + ".blocks"), read_floats(name + ".f32", kRows * kN)};
  REQUIRE(r.blocks.size() == kRows * row_bytes(t, kN));
  return r;
}

double rel_rms(const float* y, const float* x, size_t n) {
  double se = 0, ss = 0;
  for (size_t i = 0; i < n; ++i) {
    se += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    ss += double(x[i]) * x[i];
  }
  return std::sqrt(se / ss);
}

}  // namespace

TEST_CASE("quant reference: dequantize_row is bit-identical to llama.cpp's") {
  for (GgmlType t : kTypes) {
    CAPTURE(ggml_type_name(t));
    REQUIRE(traits(t).supported);
    const Reference ref = load(t);
    std::vector<float> y(kRows * kN);
    for (size_t r = 0; r < kRows; ++r) dequantize_row(t, ref.blocks.data() + r * row_bytes(t, kN), y.data() + r * kN, kN);
    size_t differ = 0;
    for (size_t i = 0; i < y.size(); ++i) differ += std::memcmp(&y[i], &ref.floats[i], sizeof(float)) != 0;
    CHECK(differ == 0);
    for (float v : ref.floats) REQUIRE(std::isfinite(v));
  }
}

// The kernels' integer sums are exact; what separates them from the f32 dot of ggml's floats with x
// is the activations' quantization (|x - d*q| <= d/2 per element, d = amax/127 of its block) and f32
// rounding: |got - dot| <= sum |w| d/2 + 2e-5 sum |w x|.
TEST_CASE("quant reference: gemm_q and gemm_packed against the f32 dot of llama.cpp's floats") {
  std::mt19937 rng(2024);
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t T = 3;
  std::vector<float> x(T * kN);
  for (auto& v : x) v = nd(rng);
  for (size_t i = 0; i < kN; ++i) x[2 * kN + i] = std::fabs(x[2 * kN + i]) + 0.25f;  // one-signed row
  for (GgmlType t : kTypes) {
    CAPTURE(ggml_type_name(t));
    const auto tid = static_cast<uint32_t>(t);
    REQUIRE(simd::has_quant_dot(tid));
    const Reference ref = load(t);
    const size_t stride = (simd::act_bytes(tid, kN) + 63) / 64 * 64;
    std::vector<uint8_t> act(T * stride);
    for (size_t i = 0; i < T; ++i) simd::quantize_act(tid, x.data() + i * kN, act.data() + i * stride, kN);
    std::vector<float> y(T * kRows);
    simd::gemm_q(tid, ref.blocks.data(), row_bytes(t, kN), kRows, act.data(), stride, T, kN, y.data(), kRows);
    const size_t B = t == GgmlType::Q5_1 || t == GgmlType::IQ4_NL ? 32 : 256;
    for (size_t i = 0; i < T; ++i) {
      const float* xi = x.data() + i * kN;
      for (size_t r = 0; r < kRows; ++r) {
        const float* w = ref.floats.data() + r * kN;
        double bound = 0, mag = 0;
        for (size_t b = 0; b < kN / B; ++b) {
          float amax = 0;
          for (size_t e = b * B; e < (b + 1) * B; ++e) amax = std::max(amax, std::fabs(xi[e]));
          for (size_t e = b * B; e < (b + 1) * B; ++e) {
            bound += std::fabs(double(w[e])) * 0.5 * (amax / 127.0);
            mag += std::fabs(double(w[e]) * xi[e]);
          }
        }
        const double dot = simd::dot_f32(w, xi, kN);
        CAPTURE(r);
        CAPTURE(i);
        CHECK(std::fabs(y[i * kRows + r] - dot) <= bound * (1 + 1e-4) + 2e-5 * mag);
      }
    }
  }
}

// Our quantizers are reference quantizers, not llama-quantize's searches: on ggml's input rows their
// relative RMS error must stay within 1.25x ggml's. Measured (test_quant_reference -s), ours / ggml's:
//   Q2_K   0.261/0.273  0.387/0.421  0.075/0.075  0.152/0.152
//   Q3_K   0.154/0.146  0.236/0.238  0.061/0.071  0.111/0.105
//   IQ4_NL 0.069/0.073  0.120/0.120  0.052/0.062  0.059/0.072
//   IQ4_XS 0.070/0.070  0.121/0.121  0.052/0.052  0.059/0.059   (Q5_1: identical)
TEST_CASE("quant reference: our quantizer's error is close to ggml's on the same rows") {
  const auto x = read_floats("input.f32", kQuantRows * kN);
  for (GgmlType t : kTypes) {
    CAPTURE(ggml_type_name(t));
    const Reference ref = load(t);
    std::vector<uint8_t> ours(row_bytes(t, kN));
    std::vector<float> y(kN);
    for (size_t r = 0; r < kQuantRows; ++r) {
      quantize_row(t, x.data() + r * kN, ours.data(), kN);
      dequantize_row(t, ours.data(), y.data(), kN);
      const double e_ours = rel_rms(y.data(), x.data() + r * kN, kN);
      const double e_ggml = rel_rms(ref.floats.data() + r * kN, x.data() + r * kN, kN);
      MESSAGE(ggml_type_name(t) << " row " << r << ": rel RMS error ours " << e_ours << ", ggml " << e_ggml);
      CAPTURE(r);
      CHECK(e_ours <= 1.25 * e_ggml);
      // Q5_1's quantizer is ggml's quantize_row_q5_1_ref step by step: the same bytes.
      if (t == GgmlType::Q5_1) CHECK(std::memcmp(ours.data(), ref.blocks.data() + r * ours.size(), ours.size()) == 0);
    }
  }
}
