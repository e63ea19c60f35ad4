#include "daemon/prefill_pacer.h"

#include <algorithm>

namespace towers::daemon {

namespace {
constexpr double kEmaWeight = 0.2;  // of the newest decode-only step
constexpr int kFirstPaced = 16;     // before any step was measured
constexpr double kFill = 0.8;       // of the room a step's target leaves
constexpr double kTokenWeight = 0.5;  // of the newest cost per prefill token
}  // namespace

PrefillPacer::PrefillPacer(int max_chunk, double slowdown, size_t max_decoding)
    : max_chunk_(std::max(1, max_chunk)),
      slowdown_(std::max(1.0, slowdown)),
      decode_only_(max_decoding + 1, 0.0),
      paced_(std::min(kFirstPaced, std::max(1, max_chunk))) {}

void PrefillPacer::observe_token_seconds(double t) {
  token_seconds_ = token_seconds_ > 0 ? (1 - kTokenWeight) * token_seconds_ + kTokenWeight * t : t;
}

int PrefillPacer::budget(size_t decoding) const { return decoding == 0 ? max_chunk_ : paced_; }

double PrefillPacer::decode_only_seconds(size_t decoding) const {
  if (decoding == 0 || decode_only_.empty()) return 0;
  const size_t n = std::min(decoding, decode_only_.size() - 1);
  if (decode_only_[n] > 0) return decode_only_[n];
  // Not seen with exactly n decodes: the nearest count seen, scaled by the count (an overestimate
  // from below and an underestimate from above are both corrected by the feedback).
  for (size_t d = 1; d < decode_only_.size(); ++d) {
    for (size_t k : {n - std::min(n, d), n + d}) {
      if (k >= 1 && k < decode_only_.size() && decode_only_[k] > 0) {
        return decode_only_[k] * static_cast<double>(n) / static_cast<double>(k);
      }
    }
  }
  return 0;
}

int PrefillPacer::background_budget(double seconds) const {
  if (token_seconds_ <= 0) return std::min(kFirstPaced, max_chunk_);
  return static_cast<int>(std::clamp(seconds / token_seconds_, 1.0, static_cast<double>(max_chunk_)));
}

void PrefillPacer::observe(double seconds, size_t decoding, size_t prefill) {
  if (seconds <= 0) return;
  if (decoding == 0) {
    // A step of prefill alone: its whole cost (its fixed part too, so that a short step's estimate
    // errs on the cheap side of the budget and the next ones grow towards the target).
    if (prefill > 0) observe_token_seconds(seconds / static_cast<double>(prefill));
    return;
  }
  if (prefill == 0) {
    double& e = decode_only_[std::min(decoding, decode_only_.size() - 1)];
    e = e > 0 ? (1 - kEmaWeight) * e + kEmaWeight * seconds : seconds;
    return;
  }
  const double alone = decode_only_seconds(decoding);
  if (alone <= 0) return;
  // The prefill part cost (seconds - alone) for `prefill` tokens: size the next one to fill 80% of the
  // room the target leaves (step times vary by ~10% at equal work), growing by at most a quarter per
  // step (cheap tokens, e.g. below the compute knee, make the estimate large and noisy).
  const double room = kFill * std::max(0.0, slowdown_ * alone - alone);
  const double cost = seconds - alone;
  if (cost > 0) observe_token_seconds(cost / static_cast<double>(prefill));
  const int base = std::max(paced_, static_cast<int>(prefill));
  const int grown = std::min(max_chunk_, base + std::max(1, base / 4));
  if (cost <= 0) {
    paced_ = grown;
    return;
  }
  const double fits = static_cast<double>(prefill) * room / cost;
  paced_ = std::clamp(static_cast<int>(fits), 1, grown);
}

}  // namespace towers::daemon
