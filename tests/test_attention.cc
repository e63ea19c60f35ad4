// simd/attention: the vectorised exp, one online-softmax block, and kv_attend (GQA groups over a span
// of quantized KV vectors) against scalar double references; bit identity across groupings and
// splits; every compiled Highway target.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <hwy/targets.h>

#include "simd/attention.h"
#include "simd/kv_quant.h"
#include "simd/ops.h"
#include "test_support.h"

using namespace towers::simd;

namespace {

const KvQuant kFormats[] = {KvQuant::F32, KvQuant::F16, KvQuant::Q8, KvQuant::Q6, KvQuant::Q4};

std::vector<float> randn(std::mt19937& rng, size_t n, float sigma = 1.0f) {
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void check_exp() {
  // A dense sweep of [-110, 88.7] (e^88.72 overflows f32) plus special values, every length mod the
  // lane count.
  std::vector<float> x;
  for (float v = -110.0f; v <= 88.7f; v += 0.0137f) x.push_back(v);
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f, -0.0f, 1.0f, -1.0f, 1e-30f, -1e-30f, -87.3f, -103.9f, -104.0f, -104.1f, -200.0f, -1e30f,
                  -std::numeric_limits<float>::max(), -inf}) {
    x.push_back(v);
  }
  for (size_t n : {x.size(), size_t(1), size_t(3), size_t(17), size_t(31)}) {
    std::vector<float> y(n);
    exp_f32(x.data(), y.data(), n);
    for (size_t i = 0; i < n; ++i) {
      CAPTURE(x[i]);
      REQUIRE(!std::isnan(y[i]));
      const double ref = std::exp(double(x[i]));
      if (x[i] < -104.0f) {
        CHECK(y[i] == 0.0f);  // very negative (and -inf): exactly 0, never NaN
      } else if (ref < std::numeric_limits<float>::min()) {
        CHECK(std::fabs(y[i] - ref) <= 2e-45);  // subnormal results: within a couple of denormal steps
      } else {
        CHECK(std::fabs(y[i] - ref) <= 2e-7 * ref);  // ~2 ulp
      }
    }
  }
  // Overflow gives +inf, not NaN.
  const float big[] = {88.8f, 100.0f, 1e30f, inf};
  float ybig[4];
  exp_f32(big, ybig, 4);
  for (float y : ybig) CHECK(y == inf);
  // In place.
  std::vector<float> z = {0.5f, -1.0f, 2.0f};
  exp_f32(z.data(), z.data(), z.size());
  CHECK(std::fabs(z[1] - std::exp(-1.0)) <= 2e-7 * std::exp(-1.0));
}

// softmax_block against a double reference, continuing from a running state.
void check_softmax(std::mt19937& rng) {
  for (int n : {1, 2, 7, 8, 15, 16, 17, 31, 33, 64, 100, 127, 128}) {
    for (float m0 : {-INFINITY, -3.0f, 0.5f, 40.0f}) {
      CAPTURE(n);
      CAPTURE(m0);
      auto s = randn(rng, n, 4.0f);
      const float scale = 0.125f;
      float m = m0, l = m0 == -INFINITY ? 0.0f : 2.5f;
      const float l0 = l;
      std::vector<float> p(n);
      const float c = softmax_block(s.data(), n, scale, &m, &l, p.data());
      double bmax = -INFINITY;
      for (int j = 0; j < n; ++j) bmax = std::max(bmax, double(s[j] * scale));
      const double mref = std::max(double(m0), bmax);
      CHECK(m == float(mref));
      if (bmax <= m0) CHECK(c == 1.0f);
      if (m0 == -INFINITY) CHECK(c == 0.0f);
      const double cref = std::exp(double(m0) - mref);
      CHECK(std::fabs(c - cref) <= 1e-6 * std::max(cref, 1e-30));
      double sum = 0;
      for (int j = 0; j < n; ++j) {
        // The argument exp sees is the f32 difference; the check is on exp's accuracy.
        const double pr = std::exp(double(s[j] * scale - m));
        CHECK(std::fabs(p[j] - pr) <= 1e-6 * pr + 1e-38);
        sum += pr;
      }
      const double lref = double(l0) * cref + sum;
      CHECK(std::fabs(l - lref) <= 1e-6 * lref);
      // In place (p == s) gives the same bits.
      float m2 = m0, l2 = l0;
      auto s2 = s;
      CHECK(softmax_block(s2.data(), n, scale, &m2, &l2, s2.data()) == c);
      CHECK(same_bits(s2, p));
      CHECK(m2 == m);
      CHECK(l2 == l);
    }
  }
}

struct Span {
  KvQuant q;
  int n, dim, heads;
  size_t vb, stride;
  std::vector<uint8_t> k, v;
  std::vector<float> kd, vd;  // dequantized [n][heads][dim]
};

Span make_span(KvQuant q, int n, int dim, int heads, std::mt19937& rng, float ksigma) {
  Span s{q, n, dim, heads, kv_vec_bytes(q, dim), 0, {}, {}, {}, {}};
  s.stride = s.vb * heads + 8;  // rows need not be packed
  s.k.resize(s.stride * n);
  s.v.resize(s.stride * n);
  s.kd.resize(size_t(n) * heads * dim);
  s.vd.resize(s.kd.size());
  auto kx = randn(rng, s.kd.size(), ksigma), vx = randn(rng, s.kd.size());
  for (int r = 0; r < n; ++r) {
    for (int h = 0; h < heads; ++h) {
      const size_t o = (size_t(r) * heads + h) * dim;
      kv_quantize(q, &kx[o], &s.k[r * s.stride + h * s.vb], dim);
      kv_quantize(q, &vx[o], &s.v[r * s.stride + h * s.vb], dim);
      kv_dequantize(q, &s.k[r * s.stride + h * s.vb], &s.kd[o], dim);
      kv_dequantize(q, &s.v[r * s.stride + h * s.vb], &s.vd[o], dim);
    }
  }
  return s;
}

// Output of kv_attend for head h's group of n_q queries over rows [0, n), split into calls at `cuts`.
std::vector<float> attend(const Span& s, int h, const float* qv, int n_q, float scale, std::vector<int> cuts) {
  std::vector<float> m(n_q, -INFINITY), l(n_q, 0.0f), acc(size_t(n_q) * s.dim, 0.0f);
  cuts.push_back(s.n);
  int r0 = 0;
  for (int r1 : cuts) {
    kv_attend(s.q, qv, n_q, s.k.data() + r0 * s.stride + h * s.vb, s.v.data() + r0 * s.stride + h * s.vb, s.stride,
              r1 - r0, s.dim, scale, m.data(), l.data(), acc.data());
    r0 = r1;
  }
  for (int g = 0; g < n_q; ++g) {
    for (int e = 0; e < s.dim; ++e) acc[size_t(g) * s.dim + e] /= l[g];
  }
  return acc;
}

void check_attend(std::mt19937& rng, int dim, int n, int n_q = 3) {
  for (KvQuant q : kFormats) {
    CAPTURE(kv_quant_name(q));
    CAPTURE(dim);
    CAPTURE(n);
    CAPTURE(n_q);
    const int heads = 2;
    const Span s = make_span(q, n, dim, heads, rng, 2.0f);
    const float scale = 1.0f / std::sqrt(float(dim));
    const auto qv = randn(rng, size_t(n_q) * dim);
    for (int h = 0; h < heads; ++h) {
      const auto out = attend(s, h, qv.data(), n_q, scale, {});
      // Double reference from the dequantized rows.
      for (int g = 0; g < n_q; ++g) {
        std::vector<double> sc(n);
        double mx = -INFINITY;
        for (int r = 0; r < n; ++r) {
          double d = 0;
          for (int e = 0; e < dim; ++e) d += double(qv[size_t(g) * dim + e]) * s.kd[(size_t(r) * heads + h) * dim + e];
          sc[r] = d * scale;
          mx = std::max(mx, sc[r]);
        }
        double sum = 0;
        std::vector<double> o(dim, 0.0);
        for (int r = 0; r < n; ++r) {
          const double p = std::exp(sc[r] - mx);
          sum += p;
          for (int e = 0; e < dim; ++e) o[e] += p * s.vd[(size_t(r) * heads + h) * dim + e];
        }
        double err = 0, mag = 0;
        for (int e = 0; e < dim; ++e) {
          err = std::max(err, std::fabs(out[size_t(g) * dim + e] - o[e] / sum));
          mag = std::max(mag, std::fabs(o[e] / sum));
        }
        CHECK(err <= 2e-5 * std::max(mag, 1e-3));
      }
      // Each query alone gives the same bits as the group.
      for (int g = 0; g < n_q; ++g) {
        const auto one = attend(s, h, qv.data() + size_t(g) * dim, 1, scale, {});
        CHECK(std::memcmp(one.data(), out.data() + size_t(g) * dim, dim * sizeof(float)) == 0);
      }
      // Calls split at multiples of kAttnBlock give the same bits as one call.
      std::vector<int> cuts;
      for (int c = kAttnBlock; c < n; c += 2 * kAttnBlock) cuts.push_back(c);
      CHECK(same_bits(attend(s, h, qv.data(), n_q, scale, cuts), out));
    }
  }
}

}  // namespace

TEST_CASE("attention: exp_f32 against std::exp, very negative inputs give 0") { check_exp(); }

TEST_CASE("attention: softmax_block against a double reference") {
  std::mt19937 rng(3);
  check_softmax(rng);
}

TEST_CASE("attention: kv_attend against a double reference, groups and splits are bit-identical") {
  std::mt19937 rng(4);
  for (int dim : {8, 40, 64, 128}) {
    for (int n : {1, 5, 128, 129, 300, 700}) check_attend(rng, dim, n);
  }
  // Groups of 4 (the Llama shapes), 7 (one pass of 4 and one of 3), 2 and 1; a prefill tile's 64 query
  // heads and more than one pass of them (x86 F32/F16: keys in lanes, staged sums).
  for (int n_q : {1, 2, 4, 7, 9, 64, 67}) {
    for (int dim : {24, 64}) check_attend(rng, dim, 300, n_q);
  }
}

TEST_CASE("attention: every compiled target") {
  std::mt19937 rng(5);
  towers::test::for_each_target([&](int64_t) {
    check_exp();
    check_softmax(rng);
    for (int dim : {24, 64}) {
      check_attend(rng, dim, 300);
      check_attend(rng, dim, 300, 7);
      check_attend(rng, dim, 300, 19);
    }
  });
}
