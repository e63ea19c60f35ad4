#include "engine/generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace towers {

namespace {

uint64_t splitmix64_next(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

using Cand = std::pair<float, int32_t>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Total order: higher logit first, then lower id.
inline bool better(const Cand& a, const Cand& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

void Xoshiro256ss::reseed(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = splitmix64_next(x);  // never all zero: splitmix64 is a bijection of a counter
}

uint64_t Xoshiro256ss::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

Status check_sampler_config(const SamplerConfig& c, int32_t n_vocab) {
  auto bad = [](std::string m) { return Status::InvalidArgument(std::move(m)); };
  const auto range = [](float v, float lim) { return v >= -lim && v <= lim; };
  if (!range(c.presence_penalty, kMaxAbsPenalty)) return bad("presence_penalty must be between -2 and 2");
  if (!range(c.frequency_penalty, kMaxAbsPenalty)) return bad("frequency_penalty must be between -2 and 2");
  if (c.logit_bias.size() > kMaxLogitBias) {
    return bad("logit_bias has " + std::to_string(c.logit_bias.size()) + " entries; at most " +
               std::to_string(kMaxLogitBias) + " are accepted");
  }
  for (const auto& [id, bias] : c.logit_bias) {
    if (id < 0 || id >= n_vocab) {
      return bad("logit_bias: token id " + std::to_string(id) + " is not in the vocabulary (0.." +
                 std::to_string(n_vocab - 1) + ")");
    }
    if (!range(bias, kMaxAbsLogitBias)) {
      return bad("logit_bias: the bias of token " + std::to_string(id) + " must be between -100 and 100");
    }
  }
  if (c.logprobs > kMaxTopLogprobs) {
    return bad("top_logprobs must be at most " + std::to_string(kMaxTopLogprobs));
  }
  return Status::Ok();
}

Sampler::Sampler(SamplerConfig config) : config_(std::move(config)), rng_(config_.seed) {}

void Sampler::reseed(uint64_t seed) {
  config_.seed = seed;
  rng_.reseed(seed);
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> recent_tokens,
                        std::span<const int32_t> generated_tokens) {
  const size_t n = logits.size();
  work_.resize(n);
  if (n == 0) return -1;

  // 1-3. The processed logits (NaN → -inf).
  for (size_t i = 0; i < n; ++i) work_[i] = logits[i] == logits[i] ? logits[i] : kNegInf;
  for (const auto& [id, bias] : config_.logit_bias) {
    if (id >= 0 && static_cast<size_t>(id) < n) work_[static_cast<size_t>(id)] += bias;
  }
  const float penalty = config_.repeat_penalty;
  if (penalty != 1.0f && config_.repeat_last_n != 0 && !recent_tokens.empty()) {
    size_t take = recent_tokens.size();
    if (config_.repeat_last_n > 0) take = std::min(take, static_cast<size_t>(config_.repeat_last_n));
    kept_.clear();
    for (int32_t t : recent_tokens.last(take)) {
      if (t >= 0 && static_cast<size_t>(t) < n) kept_.push_back(t);
    }
    std::sort(kept_.begin(), kept_.end());
    kept_.erase(std::unique(kept_.begin(), kept_.end()), kept_.end());
    for (int32_t t : kept_) {
      float& l = work_[static_cast<size_t>(t)];
      l = l <= 0.0f ? l * penalty : l / penalty;
    }
  }
  if ((config_.presence_penalty != 0.0f || config_.frequency_penalty != 0.0f) && !generated_tokens.empty()) {
    kept_.clear();
    for (int32_t t : generated_tokens) {
      if (t >= 0 && static_cast<size_t>(t) < n) kept_.push_back(t);
    }
    std::sort(kept_.begin(), kept_.end());
    for (size_t i = 0; i < kept_.size();) {
      size_t j = i;
      while (j < kept_.size() && kept_[j] == kept_[i]) ++j;
      work_[static_cast<size_t>(kept_[i])] -=
          static_cast<float>(j - i) * config_.frequency_penalty + config_.presence_penalty;
      i = j;
    }
  }

  // Greedy: the first maximum, i.e. the lowest id among ties.
  size_t imax = 0;
  for (size_t i = 1; i < n; ++i) {
    if (work_[i] > work_[imax]) imax = i;
  }
  const float lmax = work_[imax];
  // Greedy; also when nothing is possible (all -inf) or something is certain (+inf).
  if (!(config_.temperature > 0.0f) || std::isinf(lmax)) return static_cast<int32_t>(imax);

  // 4-6. The surviving tokens, in id order, into kept_.
  kept_.clear();
  const bool top_k_on = config_.top_k > 0 && static_cast<size_t>(config_.top_k) < n;
  const double log_min_p = config_.min_p > 0.0f ? std::log(static_cast<double>(config_.min_p)) : 0.0;
  // Never above the maximum, so the best token always survives (even for min_p > 1).
  const double min_p_threshold = std::min(static_cast<double>(lmax), static_cast<double>(lmax) + log_min_p);
  if (top_k_on) {
    const size_t k = static_cast<size_t>(config_.top_k);
    select_top_k(k);  // cands_ = the k best, best first
    size_t m = k;
    if (config_.top_p < 1.0f) {
      double z = 0.0;
      for (size_t i = 0; i < m; ++i) z += std::exp(static_cast<double>(cands_[i].first) - lmax);
      const double target = static_cast<double>(config_.top_p) * z;
      double cum = 0.0;
      size_t i = 0;
      while (i < m) {
        cum += std::exp(static_cast<double>(cands_[i].first) - lmax);
        ++i;
        if (cum >= target) break;
      }
      m = std::max<size_t>(i, 1);
    }
    if (config_.min_p > 0.0f) {
      size_t c = 1;
      while (c < m && static_cast<double>(cands_[c].first) >= min_p_threshold) ++c;
      m = c;
    }
    for (size_t i = 0; i < m; ++i) kept_.push_back(cands_[i].second);
    std::sort(kept_.begin(), kept_.end());
  } else {
    // No sorting of the whole vocabulary: top-p finds its cut through a histogram of the logits, and
    // top-p and min-p both keep a prefix of the order (higher logit, then lower id), so the survivors
    // are the tokens that pass both tests.
    Cand cut{kNegInf, std::numeric_limits<int32_t>::max()};  // the worst survivor of top-p
    if (config_.top_p < 1.0f) cut = top_p_cut(lmax);
    const bool min_p_on = config_.min_p > 0.0f;
    for (size_t i = 0; i < n; ++i) {
      const float l = work_[i];
      if (l == kNegInf) continue;
      if (min_p_on && static_cast<double>(l) < min_p_threshold) continue;
      if (better(cut, Cand{l, static_cast<int32_t>(i)})) continue;
      kept_.push_back(static_cast<int32_t>(i));
    }
  }
  if (kept_.size() == 1) return kept_[0];

  // 7. Temperature and the draw, walking the survivors in id order.
  const double inv_t = 1.0 / static_cast<double>(config_.temperature);
  weights_.resize(kept_.size());
  double total = 0.0;
  for (size_t i = 0; i < kept_.size(); ++i) {
    weights_[i] = std::exp((static_cast<double>(work_[static_cast<size_t>(kept_[i])]) - lmax) * inv_t);
    total += weights_[i];
  }
  const double u = rng_.uniform() * total;
  double cum = 0.0;
  for (size_t i = 0; i < kept_.size(); ++i) {
    cum += weights_[i];
    if (u < cum) return kept_[i];
  }
  // Rounding left u at the very top: the last survivor with a non-zero weight.
  for (size_t i = kept_.size(); i-- > 0;) {
    if (weights_[i] > 0.0) return kept_[i];
  }
  return static_cast<int32_t>(imax);
}

Logprobs Sampler::logprobs(int32_t token, int top_n) {
  Logprobs r;
  r.chosen.token = token;
  const size_t n = work_.size();
  if (n == 0) return r;
  // log-sum-exp in double, in id order (the same bits on every run).
  const float lmax = *std::max_element(work_.begin(), work_.end());
  double z = 0.0;
  for (float l : work_) {
    if (l != kNegInf) z += std::exp(static_cast<double>(l) - lmax);
  }
  const double lse = static_cast<double>(lmax) + std::log(z);  // NaN when nothing or +inf is possible
  auto logprob = [&](float l) {
    const double v = static_cast<double>(l) - lse;
    return v >= kLogprobFloor ? static_cast<float>(std::min(v, 0.0)) : kLogprobFloor;
  };
  if (token >= 0 && static_cast<size_t>(token) < n) r.chosen.logprob = logprob(work_[static_cast<size_t>(token)]);
  const size_t k = std::min(n, static_cast<size_t>(std::clamp(top_n, 0, kMaxTopLogprobs)));
  if (k == 0) return r;
  select_top_k(k);
  for (const Cand& c : cands_) {
    if (c.first != kNegInf) r.top.push_back({c.second, logprob(c.first), {}});
  }
  return r;
}

void Sampler::select_top_k(size_t k) {
  const size_t n = work_.size();
  cands_.clear();
  if (k <= n / 16) {
    // One pass with a heap whose top is the worst of the best k seen so far; most tokens are rejected
    // on their logit alone.
    for (size_t i = 0; i < k; ++i) cands_.push_back({work_[i], static_cast<int32_t>(i)});
    std::make_heap(cands_.begin(), cands_.end(), better);
    float worst = cands_.front().first;
    for (size_t i = k; i < n; ++i) {
      if (work_[i] < worst) continue;
      const Cand c{work_[i], static_cast<int32_t>(i)};
      if (better(c, cands_.front())) {
        std::pop_heap(cands_.begin(), cands_.end(), better);
        cands_.back() = c;
        std::push_heap(cands_.begin(), cands_.end(), better);
        worst = cands_.front().first;
      }
    }
    std::sort_heap(cands_.begin(), cands_.end(), better);
  } else {
    for (size_t i = 0; i < n; ++i) cands_.push_back({work_[i], static_cast<int32_t>(i)});
    const auto kth = cands_.begin() + static_cast<std::ptrdiff_t>(k);
    std::nth_element(cands_.begin(), kth, cands_.end(), better);
    cands_.resize(k);
    std::sort(cands_.begin(), cands_.end(), better);
  }
}

// The last token (in the order higher logit, then lower id) that top-p keeps: the smallest prefix whose
// temperature-1 probability reaches top_p. Bins of the logit's distance below the maximum give the
// probability mass above any bin edge in one pass; only the bin holding the cut is sorted.
Sampler::Cand Sampler::top_p_cut(float lmax) {
  constexpr size_t kBins = 1024;
  constexpr double kRange = 32.0;  // nats below the maximum; farther tokens share the last bin
  constexpr double kInvWidth = kBins / kRange;
  auto bin_of = [&](float l) {
    const double d = static_cast<double>(lmax) - static_cast<double>(l);
    return d >= kRange ? kBins : std::min(kBins - 1, static_cast<size_t>(d * kInvWidth));
  };
  bin_mass_.assign(kBins + 1, 0.0);
  double z = 0.0;
  for (float l : work_) {
    if (l == kNegInf) continue;
    const double e = std::exp(static_cast<double>(l) - lmax);
    z += e;
    bin_mass_[bin_of(l)] += e;
  }
  const double target = static_cast<double>(config_.top_p) * z;
  double cum = 0.0;
  size_t b = 0;
  for (; b < kBins; ++b) {
    if (cum + bin_mass_[b] >= target) break;
    cum += bin_mass_[b];
  }
  cands_.clear();
  for (size_t i = 0; i < work_.size(); ++i) {
    const float l = work_[i];
    if (l != kNegInf && bin_of(l) == b) cands_.push_back({l, static_cast<int32_t>(i)});
  }
  if (cands_.empty()) {  // only by rounding at the very end: keep everything finite
    return Cand{kNegInf, std::numeric_limits<int32_t>::max()};
  }
  std::sort(cands_.begin(), cands_.end(), better);
  for (const Cand& c : cands_) {
    cum += std::exp(static_cast<double>(c.first) - lmax);
    if (cum >= target) return c;
  }
  return cands_.back();
}

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

void StopMatcher::reset() {
  pending_.clear();
  stopped_ = false;
}

StopMatcher::Output StopMatcher::feed(std::string_view new_text) {
  Output out;
  if (stopped_) {
    out.stopped = true;
    return out;
  }
  pending_ += new_text;
  // The earliest complete stop string. Earlier text was only released when no suffix of it could begin
  // a stop string, so any match starts inside pending_.
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    out.text = pending_.substr(0, first);
    out.stopped = true;
    stopped_ = true;
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  const std::string_view p = pending_;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, p.size()); len > hold; --len) {
      if (p.ends_with(std::string_view(s).substr(0, len))) {
        hold = len;
        break;
      }
    }
  }
  out.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace towers
