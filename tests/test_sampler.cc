// Sampler (bias → penalties → top-k → top-p → min-p → temperature draw), its logprobs, and StopMatcher.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include <doctest/doctest.h>

#include "engine/generate/sampler.h"

using namespace towers;

namespace {

SamplerConfig greedy_config() {
  SamplerConfig c;
  c.temperature = 0.0f;
  return c;
}

// Pure temperature sampling: every filter off.
SamplerConfig plain_config(float temperature, uint64_t seed) {
  SamplerConfig c;
  c.temperature = temperature;
  c.top_k = 0;
  c.top_p = 1.0f;
  c.min_p = 0.0f;
  c.seed = seed;
  return c;
}

std::vector<float> random_logits(size_t n, uint64_t seed, float scale = 4.0f) {
  Xoshiro256ss rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>((rng.uniform() * 2.0 - 1.0) * scale);
  return v;
}

std::vector<int32_t> draw(Sampler& s, std::span<const float> logits, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(s.sample(logits, {}));
  return out;
}

// softmax(logits / t) restricted to `keep` (all when empty).
std::vector<double> softmax(const std::vector<float>& logits, double t, const std::set<int>& keep = {}) {
  std::vector<double> p(logits.size(), 0.0);
  double mx = -1e300;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (keep.empty() || keep.count(static_cast<int>(i))) mx = std::max(mx, static_cast<double>(logits[i]));
  }
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (keep.empty() || keep.count(static_cast<int>(i))) z += p[i] = std::exp((logits[i] - mx) / t);
  }
  for (auto& x : p) x /= z;
  return p;
}

// Pearson's chi-square statistic of observed counts against expected probabilities (cells with p > 0).
double chi_square(const std::vector<int>& counts, const std::vector<double>& p, int n) {
  double chi = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) {
      CHECK(counts[i] == 0);
      continue;
    }
    const double e = p[i] * n;
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi;
}

// Straightforward reference of the documented chain: full sort, then prefix cuts.
class ReferenceSampler {
 public:
  explicit ReferenceSampler(SamplerConfig c) : c_(c), rng_(c.seed) {}
  int32_t sample(std::span<const float> logits, std::span<const int32_t> recent,
                 std::span<const int32_t> generated = {}) {
    std::vector<float> w(logits.begin(), logits.end());
    for (auto [id, bias] : c_.logit_bias) w[id] += bias;
    if (c_.repeat_penalty != 1.0f && c_.repeat_last_n != 0) {
      size_t take = c_.repeat_last_n < 0 ? recent.size() : std::min<size_t>(recent.size(), c_.repeat_last_n);
      std::set<int32_t> ids(recent.end() - static_cast<std::ptrdiff_t>(take), recent.end());
      for (int32_t t : ids) w[t] = w[t] <= 0 ? w[t] * c_.repeat_penalty : w[t] / c_.repeat_penalty;
    }
    std::map<int32_t, int> count;
    for (int32_t t : generated) count[t]++;
    for (auto [t, k] : count) w[t] -= static_cast<float>(k) * c_.frequency_penalty + c_.presence_penalty;
    if (c_.temperature <= 0) return static_cast<int32_t>(std::max_element(w.begin(), w.end()) - w.begin());
    std::vector<std::pair<float, int32_t>> c;
    for (size_t i = 0; i < w.size(); ++i) c.push_back({w[i], static_cast<int32_t>(i)});
    std::sort(c.begin(), c.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    size_t m = c.size();
    if (c_.top_k > 0 && static_cast<size_t>(c_.top_k) < m) m = c_.top_k;
    const double lmax = std::max_element(c.begin(), c.begin() + m)->first;
    if (c_.top_p < 1.0f) {
      double z = 0;
      for (size_t i = 0; i < m; ++i) z += std::exp(c[i].first - lmax);
      double cum = 0;
      size_t i = 0;
      while (i < m) {
        cum += std::exp(c[i].first - lmax);
        ++i;
        if (cum >= c_.top_p * z) break;
      }
      m = i;
    }
    if (c_.min_p > 0.0f && m > 1) {
      const double thr = lmax + std::log(static_cast<double>(c_.min_p));
      size_t k = 0;
      while (k < m && c[k].first >= thr) ++k;
      m = std::max<size_t>(k, 1);
    }
    if (m == 1) return c[0].second;
    // The draw walks the survivors in id order.
    std::sort(c.begin(), c.begin() + m, [](auto& a, auto& b) { return a.second < b.second; });
    std::vector<double> wt(m);
    double total = 0;
    for (size_t i = 0; i < m; ++i) total += wt[i] = std::exp((c[i].first - lmax) / c_.temperature);
    const double u = rng_.uniform() * total;
    double cum = 0;
    for (size_t i = 0; i < m; ++i) {
      cum += wt[i];
      if (u < cum) return c[i].second;
    }
    return c[m - 1].second;
  }

 private:
  SamplerConfig c_;
  Xoshiro256ss rng_;
};

}  // namespace

TEST_CASE("xoshiro256** and splitmix64 seeding give the published numbers") {
  // xoshiro256** from state {1, 2, 3, 4} (reference C code by Blackman & Vigna).
  Xoshiro256ss raw(std::array<uint64_t, 4>{1, 2, 3, 4});
  CHECK(raw.next() == 11520u);
  CHECK(raw.next() == 0u);
  CHECK(raw.next() == 1509978240u);
  CHECK(raw.next() == 1215971899390074240u);
  // Seeding fills the state with splitmix64 outputs; splitmix64 from 0 starts 0xE220A8397B1DCDAF, so
  // seed 0 must equal the raw state built from the first four of them.
  Xoshiro256ss seeded(0);
  uint64_t x = 0;
  std::array<uint64_t, 4> st{};
  for (auto& s : st) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    s = z ^ (z >> 31);
  }
  CHECK(st[0] == 0xE220A8397B1DCDAFull);
  Xoshiro256ss manual(st);
  for (int i = 0; i < 4; ++i) CHECK(seeded.next() == manual.next());

  Xoshiro256ss a(42), b(42), c(43);
  for (int i = 0; i < 8; ++i) {
    const uint64_t va = a.next();
    CHECK(va == b.next());
    CHECK(va != c.next());
  }
  double sum = 0;
  Xoshiro256ss u(7);
  for (int i = 0; i < 100000; ++i) {
    const double v = u.uniform();
    REQUIRE(v >= 0.0);
    REQUIRE(v < 1.0);
    sum += v;
  }
  CHECK(std::abs(sum / 100000 - 0.5) < 0.005);
}

TEST_CASE("greedy picks the argmax, ties to the lowest id") {
  Sampler s(greedy_config());
  const std::vector<float> logits = {0.1f, 2.5f, -1.0f, 2.4f, 0.0f};
  CHECK(s.sample(logits, {}) == 1);
  const std::vector<float> ties = {1.0f, 3.0f, -2.0f, 3.0f, 3.0f};
  CHECK(s.sample(ties, {}) == 1);
  SamplerConfig neg = greedy_config();
  neg.temperature = -1.0f;
  Sampler s2(neg);
  CHECK(s2.sample(logits, {}) == 1);
  const std::vector<float> with_nan = {std::nanf(""), 0.5f, 0.25f};
  CHECK(s2.sample(with_nan, {}) == 1);
  CHECK(s2.sample(std::vector<float>{}, {}) == -1);
  // Infinite logits with sampling on: +inf is certain, all -inf falls back to the lowest id.
  Sampler hot(plain_config(1.0f, 1));
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(hot.sample(std::vector<float>{0.0f, inf, 1.0f, inf}, {}) == 1);
  CHECK(hot.sample(std::vector<float>{-inf, -inf}, {}) == 0);
  CHECK(hot.sample(std::vector<float>{-inf, 0.0f, -inf}, {}) == 1);
  Sampler hot_k(SamplerConfig{});
  CHECK(hot_k.sample(std::vector<float>{-inf, -inf, 3.0f, -inf}, {}) == 2);
}

TEST_CASE("same seed gives the same sequence, another seed another one") {
  const auto logits = random_logits(1000, 1, 2.0f);
  SamplerConfig c;  // defaults: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8
  c.seed = 1234;
  Sampler a(c), b(c);
  const auto sa = draw(a, logits, 200);
  const auto sb = draw(b, logits, 200);
  CHECK(sa == sb);
  c.seed = 1235;
  Sampler d(c);
  CHECK(draw(d, logits, 200) != sa);
  // reseed restarts the sequence.
  a.reseed(1234);
  CHECK(draw(a, logits, 200) == sa);
  CHECK(a.config().seed == 1234);
  // The sequence is not constant (it is sampling).
  CHECK(std::set<int32_t>(sa.begin(), sa.end()).size() > 3);
}

TEST_CASE("top_k = 1 equals greedy") {
  Sampler greedy(greedy_config());
  for (uint64_t trial = 0; trial < 50; ++trial) {
    const auto logits = random_logits(500, 100 + trial);
    SamplerConfig c = plain_config(1.5f, trial);
    c.top_k = 1;
    Sampler s(c);
    const int32_t g = greedy.sample(logits, {});
    for (int i = 0; i < 5; ++i) REQUIRE(s.sample(logits, {}) == g);
  }
}

TEST_CASE("a tiny top_p leaves only the argmax") {
  const auto logits = random_logits(3000, 9, 1.0f);  // flat-ish: the top token has little mass
  const int32_t best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  for (int top_k : {0, 40}) {
    SamplerConfig c = plain_config(1.0f, 5);
    c.top_k = top_k;
    c.top_p = 1e-6f;
    Sampler s(c);
    for (int i = 0; i < 100; ++i) REQUIRE(s.sample(logits, {}) == best);
  }
}

TEST_CASE("min_p excludes unlikely tokens") {
  // p_i / p_max = exp(l_i - l_max) at temperature 1: with min_p = 0.1 the cut is l >= l_max - 2.3026.
  const std::vector<float> logits = {0.0f, -1.0f, -2.0f, -2.2f, -2.4f, -3.0f, -5.0f, 0.5f};
  // l_max = 0.5, threshold = 0.5 + ln(0.1) = -1.8026: tokens 0 (0.0), 1 (-1.0), 7 (0.5) survive.
  const std::set<int32_t> expect = {0, 1, 7};
  SamplerConfig c = plain_config(2.0f, 77);  // a high temperature makes excluded tokens likely if leaked
  c.min_p = 0.1f;
  Sampler s(c);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 20000; ++i) seen[s.sample(logits, {})]++;
  for (const auto& draw : seen) {  // not a structured binding: CHECK_MESSAGE's lambda (clang 14)
    const int32_t id = draw.first;
    const int n = draw.second;
    CHECK_MESSAGE(expect.count(id), "token " << id << " drawn " << n << " times");
  }
  for (int32_t id : expect) CHECK(seen[id] > 1000);
  // Without min_p the same setting draws them all.
  Sampler open(plain_config(2.0f, 77));
  std::set<int32_t> all;
  for (int i = 0; i < 20000; ++i) all.insert(open.sample(logits, {}));
  CHECK(all.size() == logits.size());
  // min_p > 1 keeps just the best.
  SamplerConfig strict = plain_config(1.0f, 1);
  strict.min_p = 5.0f;
  Sampler st(strict);
  for (int i = 0; i < 50; ++i) REQUIRE(st.sample(logits, {}) == 7);
}

TEST_CASE("repetition penalty, llama.cpp style") {
  SamplerConfig c = greedy_config();
  c.repeat_penalty = 1.3f;
  c.repeat_last_n = 4;
  Sampler s(c);
  const std::vector<float> logits = {2.0f, 1.8f, -0.5f, -0.6f, 0.0f};
  // No history: token 0 wins.
  CHECK(s.sample(logits, {}) == 0);
  // 0 seen: 2.0 / 1.3 = 1.54 < 1.8: token 1 wins.
  const std::vector<int32_t> recent = {0};
  CHECK(s.sample(logits, recent) == 1);
  // Only the last repeat_last_n tokens matter: 0 is outside the window of 4 here (9 is out of vocab).
  const std::vector<int32_t> old = {0, 9, 4, 4, 4, 4};
  CHECK(s.sample(logits, old) == 0);
  // Negative logits are multiplied: -0.5 * 1.3 = -0.65 < -0.6, so token 1 now wins.
  const std::vector<float> negs = {-0.5f, -0.6f};
  CHECK(s.sample(negs, {}) == 0);
  const std::vector<int32_t> r0 = {0};
  CHECK(s.sample(negs, r0) == 1);
  // repeat_last_n = -1 looks at the whole history; 0 turns the penalty off.
  c.repeat_last_n = -1;
  Sampler all(c);
  CHECK(all.sample(logits, old) == 1);
  c.repeat_last_n = 0;
  Sampler off(c);
  CHECK(off.sample(logits, recent) == 0);
  // Distinct tokens: a token repeated many times is divided once (1.8 / 1.3 = 1.385 > 1.3).
  c.repeat_last_n = 64;
  Sampler once(c);
  const std::vector<float> l2 = {1.8f, 1.3f};
  const std::vector<int32_t> many = {0, 0, 0, 0, 0};
  CHECK(once.sample(l2, many) == 0);
}

TEST_CASE("draw frequencies follow softmax(logits / T)") {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 2.0f};
  const int n = 200000;
  // Critical values of chi-square at p = 0.001: 5 dof 20.5, 2 dof 13.8. The seed is fixed, so the
  // outcome is deterministic; the bound documents how far off a correct sampler may land.
  for (float t : {1.0f, 0.7f, 1.6f}) {
    Sampler s(plain_config(t, 2024));
    std::vector<int> counts(logits.size(), 0);
    for (int i = 0; i < n; ++i) counts[s.sample(logits, {})]++;
    const double chi = chi_square(counts, softmax(logits, t), n);
    INFO("temperature " << t << " chi2 " << chi);
    CHECK(chi < 20.5);
  }
  // top-k 3 renormalizes over the three best (ids 5, 0, 1).
  SamplerConfig k3 = plain_config(0.9f, 99);
  k3.top_k = 3;
  Sampler s(k3);
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) counts[s.sample(logits, {})]++;
  const double chi = chi_square(counts, softmax(logits, 0.9, {5, 0, 1}), n);
  INFO("top-k chi2 " << chi);
  CHECK(chi < 13.8);
  // top-p on the temperature-1 distribution: sorted p = {0.538, 0.198, 0.120, 0.073, ...}; 0.8 needs
  // three tokens (0.538 + 0.198 = 0.736 < 0.8), drawn at temperature 0.5. (At temperature 0.5 the two
  // best alone would already hold 0.83: a top-p computed after temperature would keep only two.)
  SamplerConfig p7 = plain_config(0.5f, 3);
  p7.top_p = 0.8f;
  Sampler sp(p7);
  std::vector<int> cp(logits.size(), 0);
  for (int i = 0; i < n; ++i) cp[sp.sample(logits, {})]++;
  const double chip = chi_square(cp, softmax(logits, 0.5, {5, 0, 1}), n);
  INFO("top-p chi2 " << chip);
  CHECK(chip < 13.8);
}

TEST_CASE("the fast path matches a full-sort reference draw for draw") {
  struct Case {
    int top_k;
    float top_p, min_p, temperature, penalty;
    float presence = 0.0f, frequency = 0.0f;
    bool bias = false;
  };
  const Case cases[] = {
      {40, 0.95f, 0.05f, 0.8f, 1.1f, 0.5f, 0.3f, true},  // defaults with every penalty and a bias
      {0, 0.9f, 0.0f, 1.0f, 1.0f, -0.4f, 1.5f, true},    // top-p, negative presence penalty
      {40, 0.95f, 0.05f, 0.8f, 1.0f},  // defaults
      {0, 0.9f, 0.0f, 1.0f, 1.0f},     // top-p alone over the whole vocabulary
      {0, 1.0f, 0.02f, 1.2f, 1.0f},    // min-p alone
      {0, 0.5f, 0.1f, 0.7f, 1.1f},     // top-p then min-p, with a penalty
      {100, 1.0f, 0.0f, 1.0f, 1.3f},   // top-k alone
      {0, 1.0f, 0.0f, 1.0f, 1.0f},     // nothing
      {2000, 0.8f, 0.05f, 0.9f, 1.0f}, // top-k 2000: nth_element at 5000 tokens, the heap at 150k
      {0, 0.0f, 0.0f, 1.0f, 1.0f},     // top_p 0: the best alone
  };
  const std::pair<size_t, float> vocab_scale[] = {{5000, 0.5f},   {5000, 6.0f},   {5000, 30.0f},
                                                  {151936, 0.5f}, {151936, 6.0f}, {151936, 30.0f}};
  for (const auto& shape : vocab_scale) {  // not a structured binding: INFO's lambda (clang 14)
    const auto vocab = shape.first;
    const auto scale = shape.second;
    const auto logits = random_logits(vocab, vocab, scale);
    std::vector<int32_t> recent, generated;
    for (int i = 0; i < 100; ++i) recent.push_back(static_cast<int32_t>((i * 7919) % vocab));
    for (int i = 0; i < 60; ++i) generated.push_back(static_cast<int32_t>((i % 7) * 13 + (i % 3)));
    for (const auto& k : cases) {
      SamplerConfig c;
      c.presence_penalty = k.presence;
      c.frequency_penalty = k.frequency;
      if (k.bias) c.logit_bias = {{5, 2.0f}, {13, -3.0f}, {27, 1.5f}, {static_cast<int32_t>(vocab - 1), 4.0f}};
      c.top_k = k.top_k;
      c.top_p = k.top_p;
      c.min_p = k.min_p;
      c.temperature = k.temperature;
      c.repeat_penalty = k.penalty;
      c.seed = 31337;
      Sampler fast(c);
      ReferenceSampler ref(c);
      const int draws = vocab > 10000 ? 6 : 40;  // the reference sorts the whole vocabulary per draw
      for (int i = 0; i < draws; ++i) {
        INFO("vocab " << vocab << " scale " << scale << " top_k " << k.top_k << " top_p " << k.top_p
                      << " min_p " << k.min_p << " draw " << i);
        REQUIRE(fast.sample(logits, recent, generated) == ref.sample(logits, recent, generated));
      }
    }
  }
}

// log softmax(w) in long double: the reference for logprobs().
std::vector<double> log_softmax(const std::vector<float>& w) {
  long double mx = -INFINITY, z = 0;
  for (float x : w) mx = std::max<long double>(mx, x);
  for (float x : w) z += std::exp(static_cast<long double>(x) - mx);
  std::vector<double> out;
  for (float x : w) out.push_back(static_cast<double>(x - mx - std::log(z)));
  return out;
}

TEST_CASE("logit_bias bans and forces tokens, presence and frequency penalties count generated tokens") {
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.5f};
  SamplerConfig c = greedy_config();
  c.logit_bias = {{0, -100.0f}};  // banned: the next best wins
  CHECK(Sampler(c).sample(logits, {}) == 1);
  c.logit_bias = {{3, 100.0f}};  // forced, also when sampling hot with every filter on
  CHECK(Sampler(c).sample(logits, {}) == 3);
  SamplerConfig hot = plain_config(2.0f, 9);
  hot.logit_bias = {{3, 100.0f}};
  Sampler hs(hot);
  for (int i = 0; i < 200; ++i) REQUIRE(hs.sample(logits, {}) == 3);
  c.logit_bias = {{2, 1.5f}, {7, 50.0f}, {-1, 50.0f}};  // 1.0 + 1.5 = 2.5; out-of-range ids are ignored
  Sampler biased(c);
  CHECK(biased.sample(logits, {}) == 0);
  auto lp = biased.logprobs(2, 0);
  CHECK(lp.chosen.logprob == doctest::Approx(log_softmax({3.0f, 2.0f, 2.5f, 0.5f})[2]).epsilon(1e-6));

  // logit -= count * frequency + (count > 0) * presence, over the generated tokens only.
  SamplerConfig pen = greedy_config();
  pen.frequency_penalty = 0.4f;
  pen.presence_penalty = 0.3f;
  Sampler ps(pen);
  const std::vector<int32_t> prompt = {0, 0, 0, 0, 0};  // the prompt's tokens do not count
  CHECK(ps.sample(logits, prompt, {}) == 0);
  const std::vector<int32_t> gen = {0, 0, 1, 3, 3, 3};
  ps.sample(logits, prompt, gen);
  const std::vector<float> expect = {3.0f - 2 * 0.4f - 0.3f, 2.0f - 0.4f - 0.3f, 1.0f, 0.5f - 3 * 0.4f - 0.3f};
  const auto ref = log_softmax(expect);
  const auto got = ps.logprobs(0, 4);
  REQUIRE(got.top.size() == 4);
  for (const auto& t : got.top) CHECK(t.logprob == doctest::Approx(ref[t.token]).epsilon(1e-6));
  const std::vector<int32_t> gen2 = {0, 0, 0, 1};
  CHECK(ps.sample(logits, prompt, gen2) == 0);  // 3 - 3 * 0.4 - 0.3 = 1.5 > 2 - 0.4 - 0.3 = 1.3
  const std::vector<int32_t> gen3 = {0, 0, 0, 0};
  CHECK(ps.sample(logits, prompt, gen3) == 1);  // 3 - 4 * 0.4 - 0.3 = 1.1 < 2.0
  // A negative penalty favours what was said; -inf (a masked token) stays -inf.
  SamplerConfig neg = greedy_config();
  neg.presence_penalty = -2.0f;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> masked = {-inf, 2.0f, 1.0f};
  const std::vector<int32_t> said = {0, 2};
  Sampler ns(neg);
  CHECK(ns.sample(masked, {}, said) == 2);
  CHECK(ns.logprobs(0, 0).chosen.logprob == kLogprobFloor);
}

TEST_CASE("logprobs are the log-softmax of the processed logits, whatever the sampling knobs") {
  for (size_t vocab : {size_t{7}, size_t{5000}, size_t{151936}}) {
    auto logits = random_logits(vocab, vocab + 3, 6.0f);
    logits[vocab / 2] = logits[vocab / 3];  // a tie: the lower id comes first
    const auto ref = log_softmax(logits);
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    double total = 0;
    for (double l : ref) total += std::exp(l);
    CHECK(total == doctest::Approx(1.0).epsilon(1e-9));
    // Greedy, hot with filters, hot without: the same numbers (truncation and temperature do not show).
    SamplerConfig knobs[3] = {greedy_config(), SamplerConfig{}, plain_config(1.7f, 4)};
    knobs[1].seed = 11;
    std::vector<float> first;
    for (const SamplerConfig& c : knobs) {
      Sampler s(c);
      const int32_t t = s.sample(logits, {});
      const auto lp = s.logprobs(t, 25);  // more than the maximum: clamped to 20 (or the vocabulary)
      CHECK(lp.chosen.token == t);
      CHECK(lp.chosen.logprob == doctest::Approx(ref[t]).epsilon(1e-6));
      REQUIRE(lp.top.size() == std::min<size_t>(vocab, kMaxTopLogprobs));
      std::vector<float> got;
      for (size_t i = 0; i < lp.top.size(); ++i) {
        INFO("vocab " << vocab << " rank " << i);
        CHECK(lp.top[i].token == order[i]);
        CHECK(lp.top[i].logprob == doctest::Approx(ref[order[i]]).epsilon(1e-6));
        CHECK(lp.top[i].logprob <= 0.0f);
        got.push_back(lp.top[i].logprob);
      }
      if (first.empty()) first = got;
      CHECK(got == first);  // bit for bit
    }
  }
  // Before any sample(), and for an id outside the vocabulary: the floor, no alternatives.
  Sampler fresh(greedy_config());
  CHECK(fresh.logprobs(3, 5).chosen.logprob == kLogprobFloor);
  CHECK(fresh.logprobs(3, 5).top.empty());
  // A certain token reads 0; impossible ones are left out of the alternatives.
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> one = {-inf, 1.0f, -inf};
  fresh.sample(one, {});
  const auto lp = fresh.logprobs(1, 3);
  CHECK(lp.chosen.logprob == 0.0f);
  REQUIRE(lp.top.size() == 1);
  CHECK(lp.top[0].token == 1);
  CHECK(fresh.logprobs(0, 0).chosen.logprob == kLogprobFloor);
}

TEST_CASE("check_sampler_config refuses out-of-range knobs, naming them") {
  auto refused = [](const SamplerConfig& c, const char* what) {
    Status s = check_sampler_config(c, 100);
    INFO(s.message());
    CHECK(s.is_invalid_argument());
    CHECK(s.message().find(what) != std::string::npos);
  };
  SamplerConfig ok;
  ok.presence_penalty = 2.0f;
  ok.frequency_penalty = -2.0f;
  ok.logit_bias = {{0, -100.0f}, {99, 100.0f}};
  ok.logprobs = kMaxTopLogprobs;
  CHECK(check_sampler_config(ok, 100).ok());
  SamplerConfig c = ok;
  c.presence_penalty = 2.5f;
  refused(c, "presence_penalty");
  c = ok;
  c.frequency_penalty = std::nanf("");
  refused(c, "frequency_penalty");
  c = ok;
  c.logit_bias = {{100, 1.0f}};
  refused(c, "token id 100 is not in the vocabulary (0..99)");
  c.logit_bias = {{-1, 1.0f}};
  refused(c, "token id -1");
  c.logit_bias = {{4, 101.0f}};
  refused(c, "between -100 and 100");
  c.logit_bias.assign(kMaxLogitBias + 1, {1, 1.0f});
  refused(c, "at most");
  c = ok;
  c.logprobs = kMaxTopLogprobs + 1;
  refused(c, "top_logprobs");
}

TEST_CASE("a 150k vocabulary samples quickly with the defaults") {
  const auto logits = random_logits(151936, 5, 8.0f);
  Sampler s(SamplerConfig{});
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 50; ++i) s.sample(logits, {});
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 50;
  MESSAGE("sample() on 151936 logits: " << ms << " ms");  // informational; speed targets live in bench/
}

TEST_CASE("StopMatcher holds back possible stop prefixes across chunks") {
  StopMatcher m({"\nUser:"});
  std::string out;
  auto r = m.feed("Hel");
  CHECK(r.text == "Hel");
  CHECK_FALSE(r.stopped);
  out += r.text;
  r = m.feed("lo\nUs");
  CHECK(r.text == "lo");  // "\nUs" could start "\nUser:"
  CHECK_FALSE(r.stopped);
  out += r.text;
  r = m.feed("er:");
  CHECK(r.text == "");
  CHECK(r.stopped);
  CHECK(m.stopped());
  CHECK(out == "Hello");
  // Nothing comes after a stop.
  r = m.feed("more");
  CHECK(r.text == "");
  CHECK(r.stopped);
  CHECK(m.flush() == "");
}

TEST_CASE("StopMatcher: a false alarm is released") {
  StopMatcher m({"\nUser:"});
  auto r = m.feed("a\nUs");
  CHECK(r.text == "a");
  r = m.feed("ed to it");
  CHECK(r.text == "\nUsed to it");
  CHECK_FALSE(r.stopped);
  r = m.feed("\n");
  CHECK(r.text == "");
  CHECK(m.flush() == "\n");
}

TEST_CASE("StopMatcher: stop at the start, inside a chunk, and none") {
  {
    StopMatcher m({"<|im_end|>"});
    auto r = m.feed("<|im_end|>trailing");
    CHECK(r.stopped);
    CHECK(r.text == "");
  }
  {
    StopMatcher m({"<|im_end|>"});
    auto r = m.feed("Sure.<|im_end|>\n<|im_start|>user");
    CHECK(r.stopped);
    CHECK(r.text == "Sure.");
  }
  {
    StopMatcher m({"STOP"});
    std::string out;
    for (std::string_view piece : {"no ", "stop ", "here", " S", "T"}) {
      auto r = m.feed(piece);
      CHECK_FALSE(r.stopped);
      out += r.text;
    }
    CHECK(out == "no stop here ");
    out += m.flush();
    CHECK(out == "no stop here ST");
  }
  {
    StopMatcher none;
    auto r = none.feed("anything \n User:");
    CHECK(r.text == "anything \n User:");
    CHECK_FALSE(r.stopped);
    StopMatcher empty_only({""});
    CHECK(empty_only.feed("x").text == "x");
  }
}

TEST_CASE("StopMatcher: overlapping prefixes and several stop strings") {
  {
    // "abcabd" inside "abcabcabd": the partial "abcab" must not hide the real match that starts at 3.
    StopMatcher m({"abcabd"});
    auto r = m.feed("abcab");
    CHECK(r.text == "");
    r = m.feed("cabd!");
    CHECK(r.stopped);
    CHECK(r.text == "abc");
  }
  {
    // Byte by byte.
    StopMatcher m({"aab"});
    std::string out;
    bool stopped = false;
    for (char ch : std::string("xaaaab-tail")) {
      auto r = m.feed(std::string_view(&ch, 1));
      out += r.text;
      stopped = r.stopped;
      if (stopped) break;
    }
    CHECK(stopped);
    CHECK(out == "xaa");
  }
  {
    // The earliest stop wins, whichever string it is.
    StopMatcher m({"\nUser:", "<|eot_id|>", "\nSystem:"});
    auto r = m.feed("Answer.\nSys");
    CHECK(r.text == "Answer.");
    r = m.feed("tem: x <|eot_id|>");
    CHECK(r.stopped);
    CHECK(r.text == "");
  }
  {
    StopMatcher m({"\nUser:", "<|eot_id|>"});
    auto r = m.feed("ok<|eot_id|> then\nUser:");
    CHECK(r.text == "ok");
    m.reset();
    CHECK_FALSE(m.stopped());
    r = m.feed("again\nUser: x");
    CHECK(r.text == "again");
    CHECK(r.stopped);
  }
  {
    // UTF-8 text passes through whole.
    StopMatcher m({"</s>"});
    auto r = m.feed("héllo wörld <");
    CHECK(r.text == "héllo wörld ");
    r = m.feed("/s>");
    CHECK(r.stopped);
  }
}
