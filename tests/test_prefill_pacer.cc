// The pacer against a simulated machine: a step costs `decode` seconds per decode token below the knee
// and `per_token` per token of prefill; the budget must settle where a step stays within the
// slowdown, and go back to full chunks when nothing decodes; background work gets the tokens that fit
// in a step of a given cost.
#include <doctest/doctest.h>

#include "daemon/prefill_pacer.h"

using towers::daemon::PrefillPacer;

namespace {
// A step of `decoding` decodes and `prefill` tokens on a compute-bound machine: 10 ms per token.
double step_seconds(size_t decoding, int prefill) { return 0.010 * static_cast<double>(decoding + static_cast<size_t>(prefill)); }
}  // namespace

TEST_CASE("alone a step takes whole chunks, and beside decodes the steps settle within the slowdown") {
  PrefillPacer pacer(256, 2.0, 8);
  CHECK(pacer.budget(0) == 256);
  for (int i = 0; i < 3; ++i) pacer.observe(step_seconds(8, 0), 8, 0);  // decode-only steps
  CHECK(pacer.decode_only_seconds(8) == doctest::Approx(0.080));
  double worst = 0;
  for (int i = 0; i < 50; ++i) {
    const int b = pacer.budget(8);
    REQUIRE(b >= 1);
    const double t = step_seconds(8, b);
    if (i >= 10) worst = std::max(worst, t / step_seconds(8, 0));
    pacer.observe(t, 8, static_cast<size_t>(b));
  }
  CHECK(worst <= 2.0 + 1e-9);           // settled: never more than twice a decode-only step
  CHECK(pacer.budget(8) >= 5);          // and not starved: 8 decodes leave room for ~8 tokens
  CHECK(pacer.budget(0) == 256);
}

TEST_CASE("an overrun shrinks the budget at once, and a count never seen is estimated from its neighbour") {
  PrefillPacer pacer(256, 2.0, 8);
  pacer.observe(0.040, 4, 0);
  CHECK(pacer.decode_only_seconds(8) == doctest::Approx(0.080));  // scaled from 4 decodes
  CHECK(pacer.decode_only_seconds(2) == doctest::Approx(0.020));
  pacer.observe(2.0, 4, 200);  // a step of 200 prefill tokens took 50 decode steps' time
  CHECK(pacer.budget(4) <= 5);
  CHECK(pacer.budget(4) >= 1);
}

TEST_CASE("a slowdown below 1 is read as 1 and no measurement leaves the first budget") {
  PrefillPacer pacer(8, 0.5, 4);
  CHECK(pacer.budget(1) == 8);  // min(16, max_chunk)
  pacer.observe(0.5, 1, 8);     // no decode-only step seen yet: nothing to compare with
  CHECK(pacer.budget(1) == 8);
}

TEST_CASE("background work is sized by time: the tokens the measured cost per prefill token fits in a step") {
  PrefillPacer pacer(256, 1.6, 8);
  CHECK(pacer.background_budget(0.1) == 16);  // nothing measured yet: a first short step
  // Prefill alone at 2 ms a step + 4 ms a token: from below to the 24 tokens that fit in 0.1 s.
  for (int i = 0; i < 10; ++i) {
    const int n = pacer.background_budget(0.1);
    CHECK(0.002 + 0.004 * n <= 0.1);
    pacer.observe(0.002 + 0.004 * n, 0, static_cast<size_t>(n));
  }
  CHECK(pacer.background_budget(0.1) == 24);
  CHECK(pacer.background_budget(100.0) == 256);  // never more than a chunk
  CHECK(pacer.background_budget(0.0001) == 1);   // never nothing
  // Beside decodes the prefill part of a step counts: 10 ms a step of one decode, +1 ms a token.
  for (int i = 0; i < 3; ++i) pacer.observe(0.010, 1, 0);
  for (int i = 0; i < 20; ++i) pacer.observe(0.010 + 0.001 * 20, 1, 20);
  CHECK(pacer.background_budget(0.1) >= 99);
  CHECK(pacer.background_budget(0.1) <= 100);
}
