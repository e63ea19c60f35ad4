// simd/int8_attention and kv_attend_int8: the VNNI kernels give the portable reference's bits; scores
// are within the int8 error of the exact dot products, also for keys with large channel offsets (the
// centring), and weighted sums within the int8 error of the exact ones; kv_attend_int8 tracks
// kv_attend, and a query's result does not depend on the other queries of the call or on splitting
// the rows at block boundaries. Kernel checks skip (SKIP:) on a
// CPU without AVX-512 VNNI; the reference's own checks run everywhere.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "simd/attention.h"
#include "simd/int8_attention.h"
#include "simd/kv_quant.h"

using namespace towers::simd;

namespace {

// n keys of dim elements, Gaussian plus a per-channel offset (`offset` on every other channel, the
// sign alternating), quantized to `format` (F32 or F16), stride bytes apart; kf: the keys as stored.
struct Keys {
  std::vector<uint8_t> bytes;
  std::vector<float> kf;
  size_t stride;
};
Keys make_keys(std::mt19937& rng, KvQuant format, int n, int dim, float offset) {
  std::normal_distribution<float> nd(0.f, 1.f);
  Keys k;
  k.stride = kv_vec_bytes(format, dim) + 8;  // not the vector's own size: rows of a cache are wider
  k.bytes.assign(k.stride * n, 0);
  k.kf.resize(size_t(n) * dim);
  std::vector<float> x(dim);
  for (int j = 0; j < n; ++j) {
    for (int e = 0; e < dim; ++e) x[e] = nd(rng) + (e % 2 ? (e % 4 == 1 ? offset : -offset) : 0.0f);
    kv_quantize(format, x.data(), k.bytes.data() + j * k.stride, dim);
    kv_dequantize(format, k.bytes.data() + j * k.stride, k.kf.data() + size_t(j) * dim, dim);
  }
  return k;
}

std::vector<float> randn(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

bool same_bytes(const void* a, const void* b, size_t n) { return std::memcmp(a, b, n) == 0; }

// Scores of n_q queries against one block, by `fast` (the kernels) or the reference.
std::vector<float> block_scores(bool fast, const std::vector<float>& qv, int n_q, const Keys& k, KvQuant format, int n,
                                int dim, Int8Queries& iq, Int8Keys& ik) {
  std::vector<float> s(size_t(n_q) * kInt8MaxKeys, -1.0f);
  if (fast) {
    int8_queries(qv.data(), n_q, dim, &iq);
    int8_keys(format, k.bytes.data(), k.stride, n, dim, &ik);
    int8_scores(iq, qv.data(), 0, n_q, ik, s.data(), kInt8MaxKeys);
  } else {
    int8_queries_reference(qv.data(), n_q, dim, &iq);
    int8_keys_reference(format, k.bytes.data(), k.stride, n, dim, &ik);
    int8_scores_reference(iq, qv.data(), 0, n_q, ik, s.data(), kInt8MaxKeys);
  }
  return s;
}

}  // namespace

TEST_CASE("int8 scores: the VNNI kernels give the reference's bits") {
  if (!int8_attention_available()) {
    MESSAGE("SKIP: this CPU has no AVX-512 VNNI; kv_attend_int8 is never called here");
    return;
  }
  std::mt19937 rng(5);
  static Int8Queries qa, qb;
  static Int8Keys ka, kb;
  for (KvQuant format : {KvQuant::F32, KvQuant::F16}) {
    for (int dim : {8, 16, 24, 32, 40, 64, 72, 128, 136, 256}) {
      for (int n : {1, 5, 16, 17, 100, 128}) {
        for (int n_q : {1, 3, 4, 5, 8, 13, 64}) {
          const std::string fmt = kv_quant_name(format);
          CAPTURE(fmt);
          CAPTURE(dim);
          CAPTURE(n);
          CAPTURE(n_q);
          const Keys k = make_keys(rng, format, n, dim, 3.0f);
          const auto qv = randn(rng, size_t(n_q) * dim);
          const auto fast = block_scores(true, qv, n_q, k, format, n, dim, qa, ka);
          const auto ref = block_scores(false, qv, n_q, k, format, n, dim, qb, kb);
          // The prepared operands, then the scores.
          for (int g = 0; g < n_q; ++g) {
            REQUIRE(same_bytes(qa.words[g], qb.words[g], size_t(dim)));
            for (int b = 0; b < (dim + 31) / 32; ++b) {
              REQUIRE(qa.scale[g][b] == qb.scale[g][b]);
              REQUIRE(qa.offset[g][b] == qb.offset[g][b]);
            }
          }
          REQUIRE(same_bytes(ka.mean, kb.mean, size_t(dim) * sizeof(float)));
          const int t_used = (n + 15) / 16;
          REQUIRE(same_bytes(ka.words, kb.words, size_t(t_used) * dim / 4 * 16 * sizeof(uint32_t)));
          REQUIRE(same_bytes(ka.scale, kb.scale, size_t(t_used) * ((dim + 31) / 32) * 16 * sizeof(float)));
          for (int g = 0; g < n_q; ++g) {
            REQUIRE(
                same_bytes(&fast[size_t(g) * kInt8MaxKeys], &ref[size_t(g) * kInt8MaxKeys], size_t(n) * sizeof(float)));
            // Nothing written past the block's keys.
            for (int j = n; j < kInt8MaxKeys; ++j) REQUIRE(fast[size_t(g) * kInt8MaxKeys + j] == -1.0f);
          }
        }
      }
    }
  }
}

TEST_CASE("int8 sums: the VNNI kernels give the reference's bits") {
  if (!int8_attention_available()) {
    MESSAGE("SKIP: this CPU has no AVX-512 VNNI");
    return;
  }
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  static Int8Values va, vb;
  for (KvQuant format : {KvQuant::F32, KvQuant::F16}) {
    for (int dim : {8, 16, 24, 40, 64, 72, 128, 136, 256}) {
      for (int n : {1, 3, 4, 5, 16, 17, 100, 128}) {
        for (int n_g : {1, 3, 4, 5, 13, 64}) {
          const std::string fmt = kv_quant_name(format);
          CAPTURE(fmt);
          CAPTURE(dim);
          CAPTURE(n);
          CAPTURE(n_g);
          const Keys v = make_keys(rng, format, n, dim, 0.0f);
          int8_values(format, v.bytes.data(), v.stride, n, dim, &va);
          int8_values_reference(format, v.bytes.data(), v.stride, n, dim, &vb);
          REQUIRE(same_bytes(va.words, vb.words, size_t((n + 3) / 4) * dim * sizeof(uint32_t)));
          REQUIRE(same_bytes(va.scale, vb.scale, sizeof(va.scale)));
          // Weights as a softmax leaves them: in [0, 1], some exactly 0, one 1; past n garbage (not read).
          std::vector<float> p(size_t(n_g) * kInt8MaxKeys, 1e30f);
          for (int g = 0; g < n_g; ++g) {
            for (int j = 0; j < n; ++j)
              p[size_t(g) * kInt8MaxKeys + j] = j % 7 == 3 ? 0.0f : j == g % n ? 1.0f : ud(rng) * ud(rng);
          }
          std::vector<float> a = randn(rng, size_t(n_g) * dim), b = a;
          int8_accumulate(p.data(), kInt8MaxKeys, n_g, va, a.data());
          int8_accumulate_reference(p.data(), kInt8MaxKeys, n_g, vb, b.data());
          REQUIRE(same_bytes(a.data(), b.data(), a.size() * sizeof(float)));
        }
      }
    }
  }
}

TEST_CASE("int8 sums: within the int8 error of the exact weighted sums") {
  // Per element: each value is off by at most half its row's step (sv/2), each weight p' = p * sv by
  // at most half the query's step (sp/2) in units of the code, so
  // |sum - exact| <= sum_j (p_j * sv_j / 2 + sp / 2 * |v8_j[e]|) + a few ulps.
  std::mt19937 rng(19);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  static Int8Values iv;
  for (int dim : {32, 64, 128}) {
    CAPTURE(dim);
    const int n = 128, n_g = 8;
    const Keys v = make_keys(rng, KvQuant::F32, n, dim, 0.0f);
    int8_values_reference(KvQuant::F32, v.bytes.data(), v.stride, n, dim, &iv);
    std::vector<float> p(size_t(n_g) * kInt8MaxKeys);
    for (auto& x : p) x = std::exp(-8.0f * ud(rng));  // a softmax's spread: weights from 1 down to e^-8
    std::vector<float> acc(size_t(n_g) * dim, 0.0f);
    int8_accumulate_reference(p.data(), kInt8MaxKeys, n_g, iv, acc.data());
    double worst = 0, num = 0, den = 0;
    for (int g = 0; g < n_g; ++g) {
      float pmax = 0;
      for (int j = 0; j < n; ++j) pmax = std::max(pmax, p[size_t(g) * kInt8MaxKeys + j] * iv.scale[j]);
      const double sp = pmax / 255.0;
      for (int e = 0; e < dim; ++e) {
        double exact = 0, bound = 0;
        for (int j = 0; j < n; ++j) {
          const double pj = p[size_t(g) * kInt8MaxKeys + j], x = v.kf[size_t(j) * dim + e];
          exact += pj * x;
          const int8_t code = static_cast<int8_t>(static_cast<uint8_t>(iv.word(j / 4)[e] >> (8 * (j % 4))));
          bound += pj * iv.scale[j] / 2 + sp / 2 * std::abs(code);
        }
        const double err = std::fabs(acc[size_t(g) * dim + e] - exact);
        worst = std::max(worst, err / (bound + 1e-6));
        num += err * err;
        den += exact * exact;
      }
    }
    MESSAGE("dim " << dim << ": error / bound at most " << worst << ", relative rms error " << std::sqrt(num / den));
    CHECK(worst <= 1.0);
    CHECK(std::sqrt(num / den) < 0.02);
  }
}

TEST_CASE("int8 scores: within the int8 error of the exact dot products, with or without channel offsets") {
  // The reference runs everywhere (the kernels give its bits, above). Error bound per (query, key):
  // each element of q and of k - mu is off by at most half its group's step (sq/2, sk/2), so
  // |score - q·k| <= sum_b (|q|_1,b * sk_b / 2 + |k - mu|_1,b * sq_b / 2) + a few ulps of the sums.
  std::mt19937 rng(9);
  static Int8Queries iq;
  static Int8Keys ik;
  for (float offset : {0.0f, 40.0f}) {
    for (int dim : {32, 64, 128}) {
      CAPTURE(offset);
      CAPTURE(dim);
      const int n = 128, n_q = 8;
      const Keys k = make_keys(rng, KvQuant::F32, n, dim, offset);
      const auto qv = randn(rng, size_t(n_q) * dim);
      const auto s = block_scores(false, qv, n_q, k, KvQuant::F32, n, dim, iq, ik);
      // Relative rms error against the spread of a query's exact scores over the keys (what the
      // softmax sees; q·mu, the same for every key, does not count).
      double worst_ratio = 0, rel_rms_num = 0, rel_rms_den = 0;
      for (int g = 0; g < n_q; ++g) {
        std::vector<double> ex(n);
        double avg = 0;
        for (int j = 0; j < n; ++j) {
          ex[j] = 0;
          for (int e = 0; e < dim; ++e) ex[j] += double(qv[size_t(g) * dim + e]) * k.kf[size_t(j) * dim + e];
          avg += ex[j] / n;
        }
        for (int j = 0; j < n; ++j) rel_rms_den += (ex[j] - avg) * (ex[j] - avg);
        for (int j = 0; j < n; ++j) {
          double exact = 0, bound = 0, mag = 0;
          for (int e = 0; e < dim; ++e) {
            const double qe = qv[size_t(g) * dim + e], ke = k.kf[size_t(j) * dim + e];
            exact += qe * ke;
            mag += std::fabs(qe * ke);
            const int b = e / 32;
            bound += std::fabs(qe) * ik.scales(j / 16, b)[j % 16] / 2 + std::fabs(ke - ik.mean[e]) * iq.scale[g][b] / 2;
          }
          const double err = std::fabs(s[size_t(g) * kInt8MaxKeys + j] - exact);
          worst_ratio = std::max(worst_ratio, err / (bound + 1e-5 * mag + 1e-6));
          rel_rms_num += err * err;
        }
      }
      MESSAGE("offset " << offset << " dim " << dim << ": error / bound at most " << worst_ratio
                        << ", relative rms error " << std::sqrt(rel_rms_num / rel_rms_den));
      CHECK(worst_ratio <= 1.0);
      // Centring: with offsets 40x the noise the relative error stays what it is without them (an
      // uncentred int8 step would be ~40x coarser: ~0.3).
      CHECK(std::sqrt(rel_rms_num / rel_rms_den) < 0.03);
    }
  }
}

TEST_CASE("kv_attend_int8 tracks kv_attend, and a query's result depends only on it and the blocks") {
  if (!int8_attention_available()) {
    MESSAGE("SKIP: this CPU has no AVX-512 VNNI");
    return;
  }
  std::mt19937 rng(13);
  for (KvQuant format : {KvQuant::F32, KvQuant::F16}) {
    for (int dim : {64, 128}) {
      for (int n : {128, 300, 512}) {
        const std::string fmt = kv_quant_name(format);
        CAPTURE(fmt);
        CAPTURE(dim);
        CAPTURE(n);
        const int n_q = 67;  // two passes of the kernel's 64 queries
        const Keys k = make_keys(rng, format, n, dim, 4.0f);
        const Keys v = make_keys(rng, format, n, dim, 0.0f);
        std::vector<Int8Keys> blocks((n + kAttnBlock - 1) / kAttnBlock);
        for (size_t b = 0; b < blocks.size(); ++b) {
          const int j0 = int(b) * kAttnBlock;
          int8_keys(format, k.bytes.data() + size_t(j0) * k.stride, k.stride, std::min(kAttnBlock, n - j0), dim,
                    &blocks[b]);
        }
        std::vector<Int8Values> vblocks(blocks.size());
        for (size_t b = 0; b < blocks.size(); ++b) {
          const int j0 = int(b) * kAttnBlock;
          int8_values(format, v.bytes.data() + size_t(j0) * v.stride, v.stride, std::min(kAttnBlock, n - j0), dim,
                      &vblocks[b]);
        }
        const auto qv = randn(rng, size_t(n_q) * dim);
        const float scale = 1.0f / std::sqrt(float(dim));
        // Rows [0, n) in calls cut at `cuts` (multiples of kAttnBlock); queries [g0, g0 + count).
        // int8: 0 exact, 1 int8 scores, 2 int8 scores and sums.
        auto run = [&](int int8, int g0, int count, std::vector<int> cuts) {
          std::vector<float> m(count, -INFINITY), l(count, 0.0f), acc(size_t(count) * dim, 0.0f);
          cuts.push_back(n);
          int r0 = 0;
          for (int r1 : cuts) {
            const float* q = qv.data() + size_t(g0) * dim;
            const uint8_t* vr = v.bytes.data() + size_t(r0) * v.stride;
            if (int8) {
              kv_attend_int8(blocks.data() + r0 / kAttnBlock, int8 == 2 ? vblocks.data() + r0 / kAttnBlock : nullptr,
                             format, q, count, vr, v.stride, r1 - r0, dim, scale, m.data(), l.data(), acc.data());
            } else {
              kv_attend(format, q, count, k.bytes.data() + size_t(r0) * k.stride, vr, v.stride, r1 - r0, dim, scale,
                        m.data(), l.data(), acc.data());
            }
            r0 = r1;
          }
          for (int g = 0; g < count; ++g) {
            for (int e = 0; e < dim; ++e) acc[size_t(g) * dim + e] /= l[g];
          }
          return acc;
        };
        const auto exact = run(0, 0, n_q, {});
        double vmag = 0;
        for (float x : v.kf) vmag = std::max(vmag, double(std::fabs(x)));
        for (int mode : {1, 2}) {
          CAPTURE(mode);
          const auto int8 = run(mode, 0, n_q, {});
          double err = 0, mag = 0;
          for (size_t i = 0; i < exact.size(); ++i) {
            err = std::max(err, double(std::fabs(int8[i] - exact[i])));
            mag = std::max(mag, double(std::fabs(exact[i])));
          }
          MESSAGE(fmt << " dim " << dim << " n " << n << (mode == 1 ? " int8 scores" : " int8 scores and sums")
                      << ": max |int8 - exact| " << err << " (outputs up to " << mag << ", values up to " << vmag
                      << ")");
          CHECK(int8 != exact);  // the int8 kernels did run
          CHECK(err <= (mode == 1 ? 0.01 : 0.02) * vmag);
          // Query g alone, in another grouping, or with the rows cut at a block boundary: the same bits.
          for (int g : {0, 5, 63, 64, 66}) {
            const auto one = run(mode, g, 1, {});
            CHECK(same_bytes(one.data(), int8.data() + size_t(g) * dim, size_t(dim) * sizeof(float)));
          }
          const auto tail = run(mode, 3, n_q - 3, {});
          CHECK(same_bytes(tail.data(), int8.data() + size_t(3) * dim, tail.size() * sizeof(float)));
          if (n > kAttnBlock) CHECK(run(mode, 0, n_q, {kAttnBlock}) == int8);
        }
      }
    }
  }
}
