// Token sampling (llama.cpp's default chain, restricted to the knobs below) and stop-string matching.
//
// Sampler::sample applies, in llama.cpp's order (common_params_sampling::samplers):
//   1. logit_bias: each listed token's bias is added to its logit (OpenAI's logit_bias; +-100 in
//      practice bans or forces a token);
//   2. repetition penalty over the distinct tokens among the last repeat_last_n of recent_tokens
//      (llama.cpp style: a positive logit is divided by repeat_penalty, a negative one multiplied);
//   3. presence and frequency penalties over the generated tokens only (OpenAI's definition):
//      logit -= count * frequency_penalty + (count > 0) * presence_penalty;
//   4. top-k (top_k <= 0: off);
//   5. top-p on the softmax of the logits at temperature 1 (top_p >= 1: off): keep the most probable
//      tokens up to and including the one where the cumulative probability reaches top_p;
//   6. min-p (min_p <= 0: off): keep tokens whose probability is at least min_p times the largest's,
//      i.e. logit >= max_logit + log(min_p);
//   7. temperature: softmax of logit / temperature over what is left, and a draw.
// Steps 1-3 give the *processed logits*: what defines the distribution before it is cut and sharpened.
// logprobs() reports log-softmax of the processed logits at temperature 1, i.e. before top-k/top-p/
// min-p and temperature: the model's distribution as the request's penalties and biases (and a
// caller's mask, e.g. a grammar) shaped it, independent of the sampling knobs. OpenAI reports the
// model's distribution likewise (logit_bias shows in its logprobs, temperature does not).
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

#include "engine/base/status.h"

namespace towers {

struct SamplerConfig {
  float temperature = 0.8f;    // <= 0: greedy
  int top_k = 40;              // <= 0: off
  float top_p = 0.95f;         // >= 1: off
  float min_p = 0.05f;         // <= 0: off
  float repeat_penalty = 1.0f; // 1: off
  int repeat_last_n = 64;      // tokens of history the penalty looks at; 0: off, -1: all given
  uint64_t seed = 0;           // every value is a valid, reproducible seed
  float presence_penalty = 0.0f;   // [-2, 2]; 0: off
  float frequency_penalty = 0.0f;  // [-2, 2]; 0: off
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias in [-100, 100])
  // What the Decoder reports per generated token: < 0 nothing; 0..kMaxTopLogprobs: the chosen
  // token's logprob and this many most likely alternatives (the sampler itself ignores it).
  int logprobs = -1;
};

constexpr int kMaxTopLogprobs = 20;
constexpr size_t kMaxLogitBias = 1024;  // entries
constexpr float kMaxAbsLogitBias = 100.0f;
constexpr float kMaxAbsPenalty = 2.0f;
// The floor of a reported logprob: tokens the processed logits rule out (-infinity) read as this, as
// in OpenAI's replies.
constexpr float kLogprobFloor = -9999.0f;

// InvalidArgument naming the field when a knob is out of range or a logit_bias id is not below n_vocab.
Status check_sampler_config(const SamplerConfig& config, int32_t n_vocab);

struct TokenLogprob {
  int32_t token = -1;
  float logprob = kLogprobFloor;  // natural log
  std::string bytes;              // the token's bytes (filled by the Decoder; may be partial UTF-8)
};
struct Logprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // most likely first (ties: lower id first); finite ones only
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
  // oldest first (prompt and generated tokens alike; ids outside the vocabulary are ignored);
  // generated_tokens are this generation's tokens so far (the presence and frequency penalties).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> recent_tokens,
                 std::span<const int32_t> generated_tokens = {});
  // Log-probabilities under the last sample() call's processed logits (see the top of this file):
  // token's, and the top_n (<= kMaxTopLogprobs) most likely tokens'. O(vocab).
  Logprobs logprobs(int32_t token, int top_n);
  // Restarts the random sequence as if constructed with this seed.
  void reseed(uint64_t seed);
  const SamplerConfig& config() const { return config_; }

 private:
  using Cand = std::pair<float, int32_t>;  // (logit, id)
  void select_top_k(size_t k);
  Cand top_p_cut(float lmax);

  SamplerConfig config_;
  Xoshiro256ss rng_;
  std::vector<float> work_;      // processed logits (after bias and penalties)
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
  size_t held_bytes() const { return pending_.size(); }
  bool stopped() const { return stopped_; }
  void reset();

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace towers
