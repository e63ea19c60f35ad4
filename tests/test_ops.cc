// simd/ops: swiglu_f32 and geglu_f32 against a double reference on every compiled target (geglu_f32_ggml
// against ggml's table formula); their result
// for an element does not depend on the element's position (tails) or on aliasing. softcap_f32 against
// its formula. rmsnorm_f32 and
// rope_f32 give exactly the bits of their plain scalar formulas.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <doctest/doctest.h>
#include "simd/f16.h"
#include "simd/ops.h"
#include "test_support.h"

using namespace towers;

namespace {

using GateFn = void (*)(const float*, const float*, float*, size_t);

double silu_ref(double g) { return g / (1.0 + std::exp(-g)); }
double silu_exponent(double g) { return -g; }
// 0.5 g (1 + tanh z) written as g / (1 + e^-2z): the same function, but 1 + tanh z cancels even in
// double once z < -18 (g < -7), which made the reference, not the kernel, the inaccurate side.
double gelu_tanh_exponent(double g) { return -2.0 * std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g); }
double gelu_tanh_ref(double g) { return g / (1.0 + std::exp(gelu_tanh_exponent(g))); }

// exponent(g): the argument of e^x the gate evaluates. The kernel computes it in float, and a rounding
// of x moves e^x by |x| ulps' worth: the bound grows with |x| (three roundings of 2^-24 each).
void check_gate(std::mt19937& rng, GateFn gate, double (*act)(double), double (*exponent)(double)) {
  std::uniform_real_distribution<float> dist(-12.0f, 12.0f);
  for (size_t n : {1, 3, 7, 8, 15, 16, 17, 33, 100, 8192}) {
    CAPTURE(n);
    std::vector<float> g(n), u(n), out(n);
    for (size_t i = 0; i < n; ++i) g[i] = dist(rng), u[i] = dist(rng);
    if (n > 4) g[0] = -200.0f, g[1] = 200.0f, g[2] = 0.0f, g[3] = -0.0f;  // exp overflow / underflow
    gate(g.data(), u.data(), out.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const double ref = act(g[i]) * u[i];
      CHECK(std::isfinite(out[i]));
      const double x = std::min(std::abs(exponent(g[i])), 88.0);
      CHECK(std::abs(out[i] - ref) <= (4e-6 + 3 * 0x1p-24 * x) * std::abs(ref) + 1e-30);
    }
    // Element i gets the same bits whether it sits in a full vector or in the tail.
    for (size_t k = 1; k < n && k < 20; ++k) {
      std::vector<float> part(n - k);
      gate(g.data() + k, u.data() + k, part.data(), n - k);
      CHECK(std::memcmp(part.data(), out.data() + k, (n - k) * sizeof(float)) == 0);
    }
    // In place (out == g), as the forward pass calls it.
    std::vector<float> inplace = g;
    gate(inplace.data(), u.data(), inplace.data(), n);
    CHECK(std::memcmp(inplace.data(), out.data(), n * sizeof(float)) == 0);
  }
}

void check_rmsnorm(std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (size_t n : {1, 5, 16, 64, 100, 2048}) {
    CAPTURE(n);
    std::vector<float> x(n), g(n), out(n);
    for (size_t i = 0; i < n; ++i) x[i] = dist(rng), g[i] = dist(rng);
    const float eps = 1e-5f;
    simd::rmsnorm_f32(x.data(), g.data(), out.data(), n, eps);
    const float scale = 1.0f / std::sqrt(simd::dot_f32(x.data(), x.data(), n) / static_cast<float>(n) + eps);
    for (size_t i = 0; i < n; ++i) REQUIRE(out[i] == x[i] * scale * g[i]);
    std::vector<float> inplace = x;
    simd::rmsnorm_f32(inplace.data(), g.data(), inplace.data(), n, eps);
    CHECK(std::memcmp(inplace.data(), out.data(), n * sizeof(float)) == 0);
  }
}

void check_rope(std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (bool neox : {false, true}) {
    for (size_t half : {1, 3, 4, 8, 16, 32, 33, 64}) {
      CAPTURE(neox);
      CAPTURE(half);
      std::vector<float> v(2 * half), c(half), s(half);
      for (float& e : v) e = dist(rng);
      for (size_t i = 0; i < half; ++i) c[i] = std::cos(0.1f * i + 0.3f), s[i] = std::sin(0.1f * i + 0.3f);
      std::vector<float> ref = v;
      for (size_t i = 0; i < half; ++i) {
        const size_t a = neox ? i : 2 * i, b = neox ? half + i : 2 * i + 1;
        const float x0 = ref[a], x1 = ref[b];
        ref[a] = x0 * c[i] - x1 * s[i];
        ref[b] = x0 * s[i] + x1 * c[i];
      }
      simd::rope_f32(v.data(), c.data(), s.data(), half, neox);
      CHECK(std::memcmp(v.data(), ref.data(), v.size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace

TEST_CASE("ops: rmsnorm_f32 and rope_f32 are their scalar formulas, bit for bit, on every target") {
  std::mt19937 rng(13);
  towers::test::for_each_target([&](int64_t) {
    check_rmsnorm(rng);
    check_rope(rng);
  });
}

void check_swiglu(std::mt19937& rng) { check_gate(rng, simd::swiglu_f32, silu_ref, silu_exponent); }

void check_softcap(std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-200.0f, 200.0f);
  for (size_t n : {1, 7, 16, 33, 1000}) {
    CAPTURE(n);
    std::vector<float> x(n);
    for (float& v : x) v = dist(rng);
    std::vector<float> capped = x;
    simd::softcap_f32(capped.data(), n, 0.125f, 5.0f);
    for (size_t i = 0; i < n; ++i) {
      const double ref = 5.0 * std::tanh(double(x[i]) * 0.125 / 5.0);
      CHECK(std::abs(capped[i] - ref) <= 4e-6 * std::abs(ref) + 1e-7);
      CHECK(std::abs(capped[i]) <= 5.0f);
    }
  }
}

TEST_CASE("ops: geglu_f32 against a double reference, tails and in-place give the same bits, and softcap_f32") {
  std::mt19937 rng(11);
  towers::test::for_each_target([&](int64_t) {
    check_gate(rng, simd::geglu_f32, gelu_tanh_ref, gelu_tanh_exponent);
    check_softcap(rng);
  });
}

TEST_CASE("ops: geglu_f32_ggml is ggml's table GELU: f16(gelu(f16(g))) * u, 0 from -10 down, g from 10 up") {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> dist(-12.0f, 12.0f);
  const size_t n = 20000;
  std::vector<float> g(n), u(n), out(n), ones(n, 1.0f), gate(n);
  for (size_t i = 0; i < n; ++i) g[i] = dist(rng), u[i] = dist(rng);
  const float edges[] = {-10.0f, 10.0f, 0.0f, -0.0f, 1e-6f, -3e-5f, -200.0f, 200.0f, 9.999f, -9.999f};
  std::copy(std::begin(edges), std::end(edges), g.begin());
  simd::geglu_f32_ggml(g.data(), ones.data(), gate.data(), n);
  simd::geglu_f32_ggml(g.data(), u.data(), out.data(), n);
  auto f16 = [](double v) { return static_cast<double>(simd::fp16_to_f32(simd::f32_to_fp16(static_cast<float>(v)))); };
  for (size_t i = 0; i < n; ++i) {
    CAPTURE(g[i]);
    if (g[i] <= -10.0f) {
      CHECK(gate[i] == 0.0f);
    } else if (g[i] >= 10.0f) {
      CHECK(gate[i] == g[i]);
    } else {
      CHECK(f16(gate[i]) == gate[i]);  // an f16 value, as ggml's table holds
      const double ref = gelu_tanh_ref(f16(g[i]));  // at the f16-rounded input
      CHECK(std::abs(gate[i] - ref) <= 0x1p-11 * 1.01 * std::abs(ref) + 0x1p-25);  // one f16 rounding
    }
    CHECK(out[i] == gate[i] * u[i]);
  }
  std::vector<float> inplace = g;  // in place (out == g), as the forward pass calls it
  simd::geglu_f32_ggml(inplace.data(), u.data(), inplace.data(), n);
  CHECK(std::memcmp(inplace.data(), out.data(), n * sizeof(float)) == 0);
}

TEST_CASE("ops: swiglu_f32 against a double reference, tails and in-place give the same bits") {
  std::mt19937 rng(11);
  check_swiglu(rng);
}

TEST_CASE("ops: swiglu_f32 on every compiled target") {
  std::mt19937 rng(12);
  towers::test::for_each_target([&](int64_t) { check_swiglu(rng); });
}

TEST_CASE("ops: quantize_symmetric_f32 and scale_i32_f32 are their scalar formulas, bit for bit, on every target") {
  std::mt19937 rng(11);
  towers::test::for_each_target([&](int64_t) {
    std::normal_distribution<float> dist(0.0f, 3.0f);
    for (size_t n : {1, 5, 16, 33, 256, 2048}) {
      for (int qmax : {63, 127}) {
        CAPTURE(n);
        CAPTURE(qmax);
        std::vector<float> v(n);
        for (auto& x : v) x = dist(rng);
        if (n >= 4) v[1] = 0.5f * v[0], v[2] = -v[0], v[3] = 0.0f;  // ties once scaled, the extremes
        std::vector<int8_t> q(n);
        const float scale = simd::quantize_symmetric_f32(v.data(), q.data(), n, qmax);
        float amax = 0;
        for (float x : v) amax = std::max(amax, std::fabs(x));
        CHECK(scale == amax / static_cast<float>(qmax));
        const float inv = amax > 0 ? static_cast<float>(qmax) / amax : 0.f;
        for (size_t i = 0; i < n; ++i) {
          CHECK(q[i] == static_cast<int8_t>(std::clamp<long>(std::lrintf(v[i] * inv), -qmax, qmax)));
        }
        // Exact halves round to even: 2.5 -> 2, 3.5 -> 4 (qmax / amax = 1 here).
        std::vector<float> halves = {2.5f, 3.5f, -2.5f, -0.5f, 1.5f, float(qmax)};
        halves.resize(std::max<size_t>(n, halves.size()), 0.0f);
        std::vector<int8_t> h(halves.size());
        simd::quantize_symmetric_f32(halves.data(), h.data(), halves.size(), qmax);
        CHECK(h[0] == 2);
        CHECK(h[1] == 4);
        CHECK(h[2] == -2);
        CHECK(h[3] == 0);
        CHECK(h[4] == 2);
        std::vector<int32_t> s(n);
        std::vector<float> w(n), out(n);
        for (size_t i = 0; i < n; ++i) s[i] = static_cast<int32_t>(rng() % 2000001) - 1000000, w[i] = dist(rng);
        simd::scale_i32_f32(s.data(), 0.37f, w.data(), out.data(), n);
        for (size_t i = 0; i < n; ++i) CHECK(out[i] == static_cast<float>(s[i]) * (0.37f * w[i]));
      }
    }
  });
}
