#include "daemon/metrics.h"

#include <algorithm>

namespace towers::daemon {

namespace {

constexpr size_t kRing = 4096;

// Bounds in seconds. Requests run from a /healthz (sub-millisecond) to a long generation
// (minutes); a first token waits for the queue and the prefill; token intervals are one model step.
const std::vector<double> kRequestBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                            1,     2.5,    5,     10,   30,    60,   120, 300};
const std::vector<double> kFirstTokenBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
const std::vector<double> kInterTokenBounds = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2.5};

void push(std::vector<double>& ring, size_t& next, double v) {
  if (ring.size() < kRing) ring.push_back(v);
  else ring[next] = v;
  next = (next + 1) % kRing;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

void Histogram::observe(double v) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  counts_[i]++;
  sum_ += v;
  count_++;
}

Metrics::Metrics() : s_{.ttft = Histogram(kFirstTokenBounds), .inter_token = Histogram(kInterTokenBounds)} {}

void Metrics::request_done(std::string_view route, std::string_view method, int status, double seconds) {
  std::lock_guard lock(mu_);
  s_.requests++;
  s_.by_request[{std::string(route), std::string(method), status}]++;
  s_.request_seconds.try_emplace(std::string(route), kRequestBounds).first->second.observe(seconds);
  // The percentiles of /v1/pool are about the API, not probes and scrapes.
  if (route != "/healthz" && route != "/metrics") push(latencies_, lat_next_, seconds);
}

void Metrics::generation_done(int prompt_tokens, int cached_tokens, int completion_tokens, double first_token_s) {
  std::lock_guard lock(mu_);
  s_.generations++;
  s_.prompt_tokens += prompt_tokens;
  s_.cached_tokens += cached_tokens;
  s_.completion_tokens += completion_tokens;
  if (first_token_s >= 0) {
    push(ttfts_, ttft_next_, first_token_s);
    s_.ttft.observe(first_token_s);
  }
}

void Metrics::generation_finished(std::string_view finish) {
  std::lock_guard lock(mu_);
  s_.finishes[std::string(finish)]++;
}

void Metrics::token_interval(double seconds) {
  std::lock_guard lock(mu_);
  s_.inter_token.observe(seconds);
}

void Metrics::batch_step(size_t sequences, size_t tokens) {
  std::lock_guard lock(mu_);
  s_.steps++;
  s_.step_tokens += tokens;
  s_.batch_sizes[sequences]++;
  s_.max_batch_seen = std::max(s_.max_batch_seen, sequences);
}

void Metrics::steps_after_cancel(uint64_t steps) {
  std::lock_guard lock(mu_);
  s_.cancelled_sequences++;
  s_.steps_after_cancel += steps;
  s_.max_steps_after_cancel = std::max(s_.max_steps_after_cancel, steps);
}

void Metrics::rejected(const std::string& why) {
  std::lock_guard lock(mu_);
  s_.rejections[why]++;
}

Metrics::Snapshot Metrics::snapshot() const {
  std::lock_guard lock(mu_);
  Snapshot s = s_;
  s.latency_p50 = percentile(latencies_, 0.50);
  s.latency_p99 = percentile(latencies_, 0.99);
  s.ttft_p50 = percentile(ttfts_, 0.50);
  s.ttft_p99 = percentile(ttfts_, 0.99);
  return s;
}

}  // namespace towers::daemon
