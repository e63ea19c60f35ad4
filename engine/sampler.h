// Token sampling (llama.cpp's default chain, restricted to the knobs below) and stop-string matching.
//
// Sampler::sample applies, in llama.cpp's order (common_params_sampling::samplers):
//   1. repetition penalty over the distinct tokens among the last repeat_last_n of recent_tokens
//      (llama.cpp style: a positive logit is divided by repeat_penalty, a negative one multiplied);
//   2. top-k (top_k <= 0: off);
//   3. top-p on the softmax of the logits at temperature 1 (top_p >= 1: off): keep the most probable
//      tokens up to and including the one where the cumulative probability reaches top_p;
//   4. min-p (min_p <= 0: off): keep tokens whose probability is at least min_p times the largest's,
//      i.e. logit >= max_logit + log(min_p);
//   5. temperature: softmax of logit / temperature over what is left, and a draw.
// Like llama.cpp (and unlike Hugging Face), temperature only shapes the final draw: top-p and min-p see
// the temperature-1 distribution. temperature <= 0 means greedy: the argmax of the penalized logits.
//
// Determinism: the filters cut prefixes of a total order (higher logit first, then lower token id),
// ties in greedy go to the lowest id, the draw walks the surviving tokens in id order, and the random
// numbers come from our own xoshiro256** seeded through splitmix64. A seed therefore gives the same
// tokens for the same logits on every platform and standard library (up to the libm's exp(), used in
// double precision). NaN logits count as -infinity.
// Cost: O(vocab) per call; nothing sorts the whole vocabulary (top-k uses a heap, top-p without top-k
// finds its cut through a histogram of the logits). On a 150k vocabulary: ~0.5 ms with the defaults,
// a few ms with top-k off.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace towers {

struct SamplerConfig {
  float temperature = 0.8f;    // <= 0: greedy
  int top_k = 40;              // <= 0: off
  float top_p = 0.95f;         // >= 1: off
  float min_p = 0.05f;         // <= 0: off
  float repeat_penalty = 1.0f; // 1: off
  int repeat_last_n = 64;      // tokens of history the penalty looks at; 0: off, -1: all given
  uint64_t seed = 0;           // every value is a valid, reproducible seed
};

// xoshiro256** (Blackman & Vigna), state filled from a 64-bit seed with splitmix64.
class Xoshiro256ss {
 public:
  explicit Xoshiro256ss(uint64_t seed = 0) { reseed(seed); }
  // A raw state (not all zero), for known-answer tests.
  explicit Xoshiro256ss(const std::array<uint64_t, 4>& state) : s_{state[0], state[1], state[2], state[3]} {}
  void reseed(uint64_t seed);
  uint64_t next();
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t s_[4];
};

class Sampler {
 public:
  explicit Sampler(SamplerConfig config);
  // Picks the next token from logits[n_vocab] (-1 if logits is empty); recent_tokens is the history,
  // oldest first (prompt and generated tokens alike; ids outside the vocabulary are ignored).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> recent_tokens);
  // Restarts the random sequence as if constructed with this seed.
  void reseed(uint64_t seed);
  const SamplerConfig& config() const { return config_; }

 private:
  using Cand = std::pair<float, int32_t>;  // (logit, id)
  void select_top_k(size_t k);
  Cand top_p_cut(float lmax);

  SamplerConfig config_;
  Xoshiro256ss rng_;
  std::vector<float> work_;      // penalized logits
  std::vector<Cand> cands_;      // sorted candidates (top-k, or top-p's boundary bin)
  std::vector<int32_t> kept_;    // surviving ids, ascending
  std::vector<double> weights_;  // their weights at the temperature
  std::vector<double> bin_mass_;
};

// Holds back generated text that might be the start of a stop string, and cuts the output before the
// first stop string. Stop strings are matched on bytes; empty ones are ignored.
class StopMatcher {
 public:
  StopMatcher() = default;
  explicit StopMatcher(std::vector<std::string> stops);

  struct Output {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string was hit: text is everything before it; nothing more comes
  };
  // Adds newly generated text. After a stop, returns {"", true} for ever (until reset()).
  Output feed(std::string_view new_text);
  // Text still held back (a possible but unfinished stop string) at the end of generation.
  std::string flush();
  bool stopped() const { return stopped_; }
  void reset();

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace towers
