// simd/kv_quant: quantized KV vectors (F16, Q8, Q6, Q4) and the attention kernels that read them in
// place. Round-trip error bounds; the byte layout documented in kv_quant.h (checked by an independent
// decoder); kv_dot_many / kv_accumulate against double references built from kv_dequantize; bit
// identity across call splits; zero, constant, outlier and non-finite inputs; every compiled target.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <hwy/targets.h>

#include "simd/kv_quant.h"
#include "simd/ops.h"
#include "test_support.h"

using namespace towers::simd;

namespace {

const KvQuant kFormats[] = {KvQuant::F32, KvQuant::F16, KvQuant::Q8, KvQuant::Q6, KvQuant::Q4};
const KvQuant kQuantized[] = {KvQuant::Q8, KvQuant::Q6, KvQuant::Q4};
// Every tail shape: dim % 16 == 8, dim % 32 in {8, 16, 24}, whole blocks; 8 (stories260K) and 128.
const int kDims[] = {8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 104, 120, 128, 136, 160, 200, 248, 256};

std::vector<float> randn(std::mt19937& rng, size_t n, float sigma = 1.0f) {
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Rows of `dim` with channels e % 64 == 5 ten times larger (K caches have a few such channels).
std::vector<float> with_outliers(std::vector<float> v, int dim) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (static_cast<int>(i % size_t(dim)) % 64 == 5) v[i] *= 10.0f;
  }
  return v;
}

// Independent IEEE binary16 decoder (not the library's).
float half(const uint8_t* p) {
  const uint16_t h = static_cast<uint16_t>(p[0] | (p[1] << 8));
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0) v = std::ldexp(double(m), -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = std::ldexp(1.0 + m / 1024.0, e - 15);
  return static_cast<float>(s ? -v : v);
}

// The layout of kv_quant.h, decoded straight from its description. Returns the code of element e
// (Q8/Q6/Q4) and sets d, m to its block's parameters.
int doc_code(KvQuant q, const uint8_t* v, int dim, int e, float& d, float& m) {
  const int nb = (dim + 31) / 32, b = e / 32;
  if (q == KvQuant::Q8) {
    d = half(v + 2 * b);
    m = 0;
    return static_cast<int8_t>(v[2 * nb + e]);
  }
  d = half(v + 4 * b);
  m = half(v + 4 * b + 2);
  const uint8_t* lo = v + 4 * nb;
  int c;
  const int runs = dim / 16;
  if (e < 16 * runs) {
    const int r = e / 16, k = e % 16;
    c = k < 8 ? lo[8 * r + k] & 15 : lo[8 * r + k - 8] >> 4;
  } else {
    const int t = e - 16 * runs;
    c = (lo[8 * runs + t / 2] >> (4 * (t % 2))) & 15;
  }
  if (q == KvQuant::Q6) {
    const uint8_t* hi = lo + dim / 2;
    const int whole = dim / 32;
    int h;
    if (e < 32 * whole) {
      const int Q = e / 32, k = e % 8, g = (e % 32) / 8;
      h = (hi[8 * Q + k] >> (2 * g)) & 3;
    } else {
      const int t = e - 32 * whole;
      h = (hi[8 * whole + t / 4] >> (2 * (t % 4))) & 3;
    }
    c |= h << 4;
  }
  return c;
}

float doc_value(KvQuant q, const uint8_t* v, int dim, int e) {
  if (q == KvQuant::F32) {
    float x;
    std::memcpy(&x, v + 4 * e, 4);
    return x;
  }
  if (q == KvQuant::F16) return half(v + 2 * e);
  float d, m;
  const int c = doc_code(q, v, dim, e, d, m);
  return q == KvQuant::Q8 ? d * static_cast<float>(c) : m + d * static_cast<float>(c);
}

// n vectors quantized `stride` bytes apart (padding filled with 0xA5), and their dequantized values.
struct Cache {
  KvQuant q{};
  int dim = 0, n = 0;
  size_t stride = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // n * dim
  const uint8_t* vec(int j) const { return bytes.data() + size_t(j) * stride; }
};

Cache make_cache(KvQuant q, const std::vector<float>& src, int n, int dim, size_t pad = 13) {
  Cache c;
  c.q = q;
  c.dim = dim;
  c.n = n;
  c.stride = kv_vec_bytes(q, dim) + pad;
  c.bytes.assign(size_t(n) * c.stride, 0xA5);  // exact size: over-reads show under ASan
  c.deq.resize(size_t(n) * dim);
  for (int j = 0; j < n; ++j) {
    kv_quantize(q, src.data() + size_t(j) * dim, c.bytes.data() + size_t(j) * c.stride, dim);
    kv_dequantize(q, c.vec(j), c.deq.data() + size_t(j) * dim, dim);
  }
  return c;
}

std::vector<float> dots(const Cache& c, const std::vector<float>& qv, int j0, int n) {
  std::vector<float> s(size_t(n), NAN);
  kv_dot_many(c.q, qv.data(), c.vec(j0), c.stride, n, c.dim, s.data());
  return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// kv_dot_many and kv_accumulate against double sums over kv_dequantize's values: within 1e-5 of
// sum |q||k| (dot) and of |acc0| + sum |p||v| (accumulate).
void check_kernels(const Cache& c, std::mt19937& rng) {
  const int dim = c.dim, n = c.n;
  const auto qv = randn(rng, size_t(dim));
  const auto s = dots(c, qv, 0, n);
  for (int j = 0; j < n; ++j) {
    double ref = 0, mag = 0;
    for (int e = 0; e < dim; ++e) {
      const double k = c.deq[size_t(j) * dim + e];
      ref += double(qv[e]) * k;
      mag += std::abs(double(qv[e]) * k);
    }
    CAPTURE(j);
    REQUIRE(std::isfinite(s[j]));
    CHECK(std::abs(s[j] - ref) <= 1e-5 * mag + 1e-30);
  }
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  std::vector<float> p(static_cast<size_t>(n));
  for (auto& x : p) x = ud(rng);
  auto acc = randn(rng, size_t(dim));
  const auto acc0 = acc;
  kv_accumulate(c.q, p.data(), c.vec(0), c.stride, n, dim, acc.data());
  for (int e = 0; e < dim; ++e) {
    double ref = acc0[e], mag = std::abs(acc0[e]);
    for (int j = 0; j < n; ++j) {
      ref += double(p[j]) * c.deq[size_t(j) * dim + e];
      mag += std::abs(double(p[j]) * c.deq[size_t(j) * dim + e]);
    }
    CAPTURE(e);
    REQUIRE(std::isfinite(acc[e]));
    CHECK(std::abs(acc[e] - ref) <= 1e-5 * mag + 1e-30);
  }
}

// kv_dot_many over n equals n calls of 1 (and other splits); kv_accumulate over [0, n) equals
// consecutive calls over pieces of it, in order; bit for bit.
void check_splits(const Cache& c, std::mt19937& rng) {
  const int dim = c.dim, n = c.n;
  const auto qv = randn(rng, size_t(dim));
  const auto all = dots(c, qv, 0, n);
  std::vector<float> ones, pieces;
  for (int j = 0; j < n; ++j) ones.push_back(dots(c, qv, j, 1)[0]);
  CHECK(same_bits(all, ones));
  for (int j0 = 0, len = 1; j0 < n; j0 += len, len = len % 6 + 1) {
    const auto part = dots(c, qv, j0, std::min(len, n - j0));
    pieces.insert(pieces.end(), part.begin(), part.end());
  }
  CHECK(same_bits(all, pieces));

  std::uniform_real_distribution<float> ud(0.f, 1.f);
  std::vector<float> p(static_cast<size_t>(n));
  for (auto& x : p) x = ud(rng);
  const auto acc0 = randn(rng, size_t(dim));
  auto one_call = acc0, singles = acc0, split = acc0;
  kv_accumulate(c.q, p.data(), c.vec(0), c.stride, n, dim, one_call.data());
  for (int j = 0; j < n; ++j) kv_accumulate(c.q, p.data() + j, c.vec(j), c.stride, 1, dim, singles.data());
  CHECK(same_bits(one_call, singles));
  for (int j0 = 0, len = 3; j0 < n; j0 += len, len = len * 2 + 1) {
    kv_accumulate(c.q, p.data() + j0, c.vec(j0), c.stride, std::min(len, n - j0), dim, split.data());
  }
  CHECK(same_bits(one_call, split));
}

// Round trip: relative RMS error over `count` vectors.
double rel_rms(KvQuant q, const std::vector<float>& src, int dim) {
  const int n = static_cast<int>(src.size() / size_t(dim));
  std::vector<uint8_t> buf(kv_vec_bytes(q, dim));
  std::vector<float> y(static_cast<size_t>(dim));
  double e2 = 0, x2 = 0;
  for (int j = 0; j < n; ++j) {
    const float* x = src.data() + size_t(j) * dim;
    kv_quantize(q, x, buf.data(), dim);
    kv_dequantize(q, buf.data(), y.data(), dim);
    for (int e = 0; e < dim; ++e) {
      e2 += double(y[e] - x[e]) * (y[e] - x[e]);
      x2 += double(x[e]) * x[e];
    }
  }
  return std::sqrt(e2 / x2);
}

// Quantized formats: every element within half a step of its (saturated) input.
void check_half_step(KvQuant q, const float* x, const uint8_t* v, const float* y, int dim) {
  for (int e = 0; e < dim; ++e) {
    float d, m;
    doc_code(q, v, dim, e, d, m);
    const float xs = std::isnan(x[e]) ? 0.f : std::clamp(x[e], -65504.f, 65504.f);
    CAPTURE(e);
    CAPTURE(xs);
    CAPTURE(y[e]);
    CHECK(d >= 0.f);
    CHECK(std::abs(double(y[e]) - xs) <= 0.5 * d * (1 + 1e-5) + 1.2e-7 * std::abs(xs));
  }
}

// kv_dot_group / kv_accumulate_group for n_q = 1..7 queries (passes of 4, 3, 2 and 1) and for 8, 9, 13
// and 66 (on x86, F32/F16: keys in lanes, 8 or 16 per block, and sums over a staged copy; a prefill
// tile has 64): every query's scores and sums have the bits of kv_dot_many / kv_accumulate for that
// query alone, for whole ranges and for split calls.
void check_group(const Cache& c, std::mt19937& rng) {
  const int dim = c.dim, n = c.n;
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  for (int n_q : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 66}) {
    CAPTURE(n_q);
    const auto qv = randn(rng, size_t(n_q) * dim);
    const size_t ss = size_t(n) + 3;  // score / weight stride
    std::vector<float> s(ss * n_q, NAN);
    kv_dot_group(c.q, qv.data(), n_q, c.vec(0), c.stride, n, dim, s.data(), ss);
    std::vector<float> p(ss * n_q);
    for (auto& x : p) x = ud(rng);
    const auto acc0 = randn(rng, size_t(n_q) * dim);
    auto acc = acc0, split = acc0;
    kv_accumulate_group(c.q, p.data(), ss, n_q, c.vec(0), c.stride, n, dim, acc.data());
    for (int j0 = 0, len = 5; j0 < n; j0 += len, len = len * 2 + 1) {
      kv_accumulate_group(c.q, p.data() + j0, ss, n_q, c.vec(j0), c.stride, std::min(len, n - j0), dim,
                          split.data());
    }
    CHECK(same_bits(acc, split));
    // Announcing the rows after the range (n_ahead: the kernels prefetch into them) changes nothing.
    {
      const int h = (n + 1) / 2;
      std::vector<float> sh(ss * n_q, NAN);
      kv_dot_group(c.q, qv.data(), n_q, c.vec(0), c.stride, h, dim, sh.data(), ss, n - h);
      for (int g = 0; g < n_q; ++g) {
        CHECK(std::memcmp(sh.data() + size_t(g) * ss, s.data() + size_t(g) * ss, size_t(h) * sizeof(float)) == 0);
      }
      auto ah = acc0, ah0 = acc0;
      kv_accumulate_group(c.q, p.data(), ss, n_q, c.vec(0), c.stride, h, dim, ah.data(), n - h);
      kv_accumulate_group(c.q, p.data(), ss, n_q, c.vec(0), c.stride, h, dim, ah0.data());
      CHECK(same_bits(ah, ah0));
    }
    for (int g = 0; g < n_q; ++g) {
      CAPTURE(g);
      std::vector<float> one(size_t(n), NAN);
      kv_dot_many(c.q, qv.data() + size_t(g) * dim, c.vec(0), c.stride, n, dim, one.data());
      CHECK(std::memcmp(one.data(), s.data() + size_t(g) * ss, size_t(n) * sizeof(float)) == 0);
      std::vector<float> a(acc0.begin() + size_t(g) * dim, acc0.begin() + size_t(g + 1) * dim);
      kv_accumulate(c.q, p.data() + size_t(g) * ss, c.vec(0), c.stride, n, dim, a.data());
      CHECK(std::memcmp(a.data(), acc.data() + size_t(g) * dim, size_t(dim) * sizeof(float)) == 0);
    }
    // The score and weight padding between queries is left alone.
    for (int g = 0; g < n_q; ++g) {
      for (size_t j = size_t(n); j < ss; ++j) CHECK(std::isnan(s[size_t(g) * ss + j]));
    }
  }
}

}  // namespace

TEST_CASE("kv_quant: sizes and names") {
  CHECK(std::string(kv_quant_name(KvQuant::Q4)) == "q4");
  CHECK(std::string(kv_quant_name(KvQuant::F16)) == "f16");
  struct Row {
    int dim;
    size_t f32, f16, q8, q6, q4;
  };
  for (const Row& r : {Row{8, 32, 16, 10, 10, 8}, Row{64, 256, 128, 68, 56, 40}, Row{128, 512, 256, 136, 112, 80},
                       Row{256, 1024, 512, 272, 224, 160}, Row{80, 320, 160, 86, 72, 52}}) {
    CAPTURE(r.dim);
    CHECK(kv_vec_bytes(KvQuant::F32, r.dim) == r.f32);
    CHECK(kv_vec_bytes(KvQuant::F16, r.dim) == r.f16);
    CHECK(kv_vec_bytes(KvQuant::Q8, r.dim) == r.q8);
    CHECK(kv_vec_bytes(KvQuant::Q6, r.dim) == r.q6);
    CHECK(kv_vec_bytes(KvQuant::Q4, r.dim) == r.q4);
  }
  for (int bad : {0, 4, 12, 264, -8}) {
    CHECK_FALSE(kv_quant_ok(KvQuant::Q4, bad));
    CHECK(kv_vec_bytes(KvQuant::Q4, bad) == 0);
  }
  CHECK_FALSE(kv_quant_ok(static_cast<KvQuant>(9), 64));
}

TEST_CASE("kv_quant: byte layout is the documented one") {
  std::mt19937 rng(3);
  for (KvQuant q : kFormats) {
    for (int dim : kDims) {
      CAPTURE(kv_quant_name(q));
      CAPTURE(dim);
      const auto x = with_outliers(randn(rng, size_t(4 * dim), 2.0f), dim);
      const Cache c = make_cache(q, x, 4, dim);
      for (int j = 0; j < 4; ++j) {
        for (int e = 0; e < dim; ++e) {
          CAPTURE(e);
          REQUIRE(doc_value(q, c.vec(j), dim, e) == c.deq[size_t(j) * dim + e]);
        }
        // The padding after each vector is untouched.
        for (size_t b = kv_vec_bytes(q, dim); b < c.stride; ++b) REQUIRE(c.vec(j)[b] == 0xA5);
      }
    }
  }
  // Pinned bytes of one small vector per format (a file format must not drift silently).
  const float x[8] = {0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f};
  uint8_t b[32];
  kv_quantize(KvQuant::Q4, x, b, 8);  // m = 0, d = f16 above 7/15 = 0x3778, codes 0,2,4,6,9,11,13,15
  const uint8_t q4[8] = {0x78, 0x37, 0x00, 0x00, 0x20, 0x64, 0xB9, 0xFD};
  CHECK(std::memcmp(b, q4, 8) == 0);
  kv_quantize(KvQuant::Q8, x, b, 8);  // d = f16 above 7/127 = 0x2B0F
  CHECK(b[0] == 0x0F);
  CHECK(b[1] == 0x2B);
  CHECK(b[2 + 7] == 127);
  kv_quantize(KvQuant::F16, x, b, 8);
  CHECK(b[14] == 0x00);
  CHECK(b[15] == 0x47);  // 7.0 = 0x4700
}

TEST_CASE("kv_quant: round-trip error") {
  // Bounds ~1.3x the largest error measured over these dims (Gaussian / 10x outlier channels).
  struct Bound {
    KvQuant q;
    double gauss, outl;
  };
  const Bound bounds[] = {{KvQuant::F16, 2.7e-4, 2.7e-4},
                          {KvQuant::Q8, 7.0e-3, 1.35e-2},
                          {KvQuant::Q6, 2.45e-2, 3.2e-2},
                          {KvQuant::Q4, 1.02e-1, 1.35e-1}};
  std::mt19937 rng(5);
  for (const Bound& bd : bounds) {
    std::string line = std::string(kv_quant_name(bd.q)) + " rel RMS (gauss/outliers):";
    for (int dim : kDims) {
      CAPTURE(kv_quant_name(bd.q));
      CAPTURE(dim);
      const int n = 4096 / dim + 200;
      const auto g = randn(rng, size_t(n) * dim);
      const auto o = with_outliers(randn(rng, size_t(n) * dim), dim);
      const double eg = rel_rms(bd.q, g, dim), eo = rel_rms(bd.q, o, dim);
      CHECK(eg <= bd.gauss);
      CHECK(eo <= bd.outl);
      if (dim == 8 || dim == 64 || dim == 128) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "  dim %d %.3e/%.3e", dim, eg, eo);
        line += buf;
      }
    }
    MESSAGE(line);
  }
  // F32 is a copy.
  const auto x = randn(rng, 64);
  std::vector<uint8_t> buf(kv_vec_bytes(KvQuant::F32, 64));
  std::vector<float> y(64);
  kv_quantize(KvQuant::F32, x.data(), buf.data(), 64);
  kv_dequantize(KvQuant::F32, buf.data(), y.data(), 64);
  CHECK(same_bits(x, y));
}

TEST_CASE("kv_quant: every element within half a step") {
  std::mt19937 rng(6);
  for (KvQuant q : kQuantized) {
    for (int dim : kDims) {
      CAPTURE(kv_quant_name(q));
      CAPTURE(dim);
      for (float sigma : {1e-3f, 1.0f, 300.0f}) {
        auto x = with_outliers(randn(rng, size_t(dim), sigma), dim);
        for (int e = 0; e < dim; e += 7) x[e] += 3 * sigma;  // asymmetric blocks
        std::vector<uint8_t> v(kv_vec_bytes(q, dim));
        std::vector<float> y(static_cast<size_t>(dim));
        kv_quantize(q, x.data(), v.data(), dim);
        kv_dequantize(q, v.data(), y.data(), dim);
        check_half_step(q, x.data(), v.data(), y.data(), dim);
      }
      // Large values with a small spread (the min's f16 rounding must not cost precision).
      auto x = randn(rng, size_t(dim), 0.01f);
      for (auto& e : x) e += 1000.3f;
      std::vector<uint8_t> v(kv_vec_bytes(q, dim));
      std::vector<float> y(static_cast<size_t>(dim));
      kv_quantize(q, x.data(), v.data(), dim);
      kv_dequantize(q, v.data(), y.data(), dim);
      check_half_step(q, x.data(), v.data(), y.data(), dim);
    }
  }
}

TEST_CASE("kv_quant: kernels against double references") {
  std::mt19937 rng(7);
  for (KvQuant q : kFormats) {
    for (int dim : kDims) {
      CAPTURE(kv_quant_name(q));
      CAPTURE(dim);
      const int n = 37;
      check_kernels(make_cache(q, randn(rng, size_t(n) * dim), n, dim), rng);
      check_kernels(make_cache(q, with_outliers(randn(rng, size_t(n) * dim, 3.0f), dim), n, dim, 0), rng);
      // Offset blocks (large min, small spread): the min term carries most of the score.
      auto off = randn(rng, size_t(n) * dim, 0.1f);
      for (auto& e : off) e += 5.0f;
      check_kernels(make_cache(q, off, n, dim, 1), rng);
    }
  }
}

TEST_CASE("kv_quant: results do not depend on how the range is split") {
  std::mt19937 rng(8);
  for (KvQuant q : kFormats) {
    for (int dim : {8, 24, 40, 64, 72, 128, 136, 256}) {
      CAPTURE(kv_quant_name(q));
      CAPTURE(dim);
      const int n = 37;
      check_splits(make_cache(q, with_outliers(randn(rng, size_t(n) * dim), dim), n, dim), rng);
    }
  }
}

TEST_CASE("kv_quant: group kernels give each query's single-query bits") {
  std::mt19937 rng(12);
  for (KvQuant q : kFormats) {
    for (int dim : kDims) {
      CAPTURE(kv_quant_name(q));
      CAPTURE(dim);
      const int n = 70;  // more than one chunk of kv_accumulate (64 vectors)
      check_group(make_cache(q, with_outliers(randn(rng, size_t(n) * dim), dim), n, dim), rng);
    }
  }
}

TEST_CASE("kv_quant: zero, constant, huge and non-finite inputs") {
  std::mt19937 rng(9);
  for (KvQuant q : kFormats) {
    for (int dim : {8, 40, 128}) {
      CAPTURE(kv_quant_name(q));
      CAPTURE(dim);
      const size_t vb = kv_vec_bytes(q, dim);
      std::vector<uint8_t> v(vb);
      std::vector<float> y(static_cast<size_t>(dim));
      // Zeros: exact zeros back, zero scores, accumulate leaves acc unchanged.
      std::vector<float> z(size_t(dim), 0.0f);
      kv_quantize(q, z.data(), v.data(), dim);
      kv_dequantize(q, v.data(), y.data(), dim);
      for (float e : y) CHECK(e == 0.0f);
      const auto qv = randn(rng, size_t(dim));
      float s = NAN;
      kv_dot_many(q, qv.data(), v.data(), vb, 1, dim, &s);
      CHECK(s == 0.0f);
      auto acc = randn(rng, size_t(dim));
      const auto acc0 = acc;
      const float p = 0.75f;
      kv_accumulate(q, &p, v.data(), vb, 1, dim, acc.data());
      CHECK(same_bits(acc, acc0));
      // Constants (max == min), f16-representable or not, either sign.
      for (float c : {2.5f, -3.7f, 0.1f, 1000.3f}) {
        CAPTURE(c);
        std::vector<float> x(size_t(dim), c);
        kv_quantize(q, x.data(), v.data(), dim);
        kv_dequantize(q, v.data(), y.data(), dim);
        const double tol = q == KvQuant::F32 ? 0.0 : q == KvQuant::Q8 ? std::abs(c) / 254 : std::abs(c) * 1e-3;
        for (float e : y) CHECK(std::abs(double(e) - c) <= tol);
        if (c == 2.5f && q != KvQuant::Q8) {
          for (float e : y) CHECK(e == c);  // an f16 value: exact (Q8 has no offset: within d/2)
        }
      }
      // Huge values and outliers: saturated to the f16 range, never inf or NaN.
      auto x = randn(rng, size_t(dim));
      x[1] = 60000.f;
      x[2] = -1e9f;
      x[dim - 1] = 1e30f;
      x[3] = NAN;
      kv_quantize(q, x.data(), v.data(), dim);
      kv_dequantize(q, v.data(), y.data(), dim);
      if (q == KvQuant::F32) {
        CHECK(std::isnan(y[3]));
        continue;
      }
      for (float e : y) REQUIRE(std::isfinite(e));
      if (q == KvQuant::F16) {
        CHECK(y[1] == 60000.f);
        CHECK(y[2] == -65504.f);
        CHECK(y[3] == 0.f);
        CHECK(y[dim - 1] == 65504.f);
      } else {
        check_half_step(q, x.data(), v.data(), y.data(), dim);  // NaN as 0, the rest saturated
      }
      kv_dot_many(q, qv.data(), v.data(), vb, 1, dim, &s);
      CHECK(std::isfinite(s));
    }
  }
  // Tiny blocks: below f16's normal range the scale goes subnormal, still within half a step.
  for (KvQuant q : kQuantized) {
    auto x = randn(rng, 64, 1e-6f);
    std::vector<uint8_t> v(kv_vec_bytes(q, 64));
    std::vector<float> y(64);
    kv_quantize(q, x.data(), v.data(), 64);
    kv_dequantize(q, v.data(), y.data(), 64);
    check_half_step(q, x.data(), v.data(), y.data(), 64);
  }
}

// ... and writes every byte of its vector (segments are quantized into memory that is not zeroed
// first: engine/model/segment.cc).
TEST_CASE("kv_quant: quantization is deterministic") {
  std::mt19937 rng(10);
  for (KvQuant q : kFormats) {
    for (int dim : {8, 64, 80, 128, 256}) {
      CAPTURE(dim);
      const auto x = randn(rng, dim);
      std::vector<uint8_t> a(kv_vec_bytes(q, dim), 0), b(kv_vec_bytes(q, dim), 0xFF);
      kv_quantize(q, x.data(), a.data(), dim);
      kv_quantize(q, x.data(), b.data(), dim);
      CHECK(a == b);
    }
  }
}

// Every Highway target compiled in and runnable here (AVX2, SSE4, SSSE3, EMU128 on an AVX2 machine):
// the 4-lane targets take the two-halves path of every kernel.
TEST_CASE("kv_quant: every compiled target") {
  std::mt19937 rng(11);
  towers::test::for_each_target([&](int64_t target) {
    CHECK(std::string(target_name()) == hwy::TargetName(target));
    for (KvQuant q : kFormats) {
      for (int dim : {8, 24, 48, 72, 128, 136}) {
        CAPTURE(kv_quant_name(q));
        CAPTURE(dim);
        const int n = 37;
        const Cache c = make_cache(q, with_outliers(randn(rng, size_t(n) * dim), dim), n, dim);
        check_kernels(c, rng);
        check_splits(c, rng);
        check_group(c, rng);
      }
    }
  });
}
