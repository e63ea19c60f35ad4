// How many prompt and build tokens a scheduler step may carry beside its decodes. Alone, a step takes
// up to prefill_chunk of them (prefill at full speed). While streams decode, a step may take at most
// `slowdown` times what a step of the same decodes alone takes, so a 2000-token segment PUT slows the
// streams by a bounded factor instead of stalling them (issue 12). A feedback rule on measured step
// times, no model of the hardware: each step's prefill cost per token sizes the next step's budget to
// the room its target leaves (growing by at most a quarter per step). Background work (nobody waits
// for it) is bounded in time instead: as many tokens as the measured cost per prefill token says fit
// in one short step.
#pragma once
#include <cstddef>
#include <vector>

namespace towers::daemon {

class PrefillPacer {
 public:
  PrefillPacer(int max_chunk, double slowdown, size_t max_decoding);

  // Prefill tokens the next step may carry beside `decoding` decode tokens.
  int budget(size_t decoding) const;
  // After a step: its wall time, its decode tokens and its prefill tokens.
  void observe(double seconds, size_t decoding, size_t prefill);

  // The time a step of `decoding` decodes alone is expected to take (0: not seen yet).
  double decode_only_seconds(size_t decoding) const;
  // Prefill tokens expected to cost about `seconds` (at least 1, at most max_chunk): from the last
  // steps' cost per prefill token; a first guess of a few tokens before any was measured.
  int background_budget(double seconds) const;

 private:
  void observe_token_seconds(double seconds);

  const int max_chunk_;
  const double slowdown_;
  std::vector<double> decode_only_;  // EMA of decode-only step time, by number of decodes
  int paced_;                        // the budget while decoding
  double token_seconds_ = 0;         // EMA of the cost of one prefill token (0: not seen yet)
};

}  // namespace towers::daemon
