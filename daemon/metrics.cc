#include "daemon/metrics.h"

#include <algorithm>

namespace towers::daemon {

namespace {
constexpr size_t kRing = 4096;
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

void Metrics::request_done(const std::string& route, int status, double seconds) {
  std::lock_guard lock(mu_);
  s_.requests++;
  s_.by_route_status[route + " " + std::to_string(status)]++;
  push(latencies_, lat_next_, seconds);
}

void Metrics::generation_done(int prompt_tokens, int cached_tokens, int completion_tokens, double first_token_s) {
  std::lock_guard lock(mu_);
  s_.generations++;
  s_.prompt_tokens += prompt_tokens;
  s_.cached_tokens += cached_tokens;
  s_.completion_tokens += completion_tokens;
  if (first_token_s >= 0) push(ttfts_, ttft_next_, first_token_s);
}

void Metrics::batch_step(size_t sequences, size_t tokens) {
  std::lock_guard lock(mu_);
  s_.steps++;
  s_.step_tokens += tokens;
  s_.batch_sizes[sequences]++;
  s_.max_batch_seen = std::max(s_.max_batch_seen, sequences);
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
