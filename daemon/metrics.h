// What towerd counts while it serves, for /metrics (daemon/metrics_text.h writes it out) and
// /v1/pool. Thread-safe; every method takes one short lock. Labels are bounded by construction:
// routes come from the fixed route table (daemon/routes.h), statuses are HTTP codes, reasons are
// fixed strings of the code.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace towers::daemon {

// Prometheus-style histogram with fixed upper bounds (seconds); counts are per bucket, the last
// one above every bound (+Inf).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  const std::vector<uint64_t>& counts() const { return counts_; }
  double sum() const { return sum_; }
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  // An answered HTTP request: route label (routes.h), method label, status, seconds to its last byte.
  void request_done(std::string_view route, std::string_view method, int status, double seconds);
  // The scheduler, when a generation that ran ends.
  void generation_done(int prompt_tokens, int cached_tokens, int completion_tokens, double first_token_s);
  // The API, when a generation request ends, run or not (eos, stop, length, context, timeout,
  // cancelled, error).
  void generation_finished(std::string_view finish);
  // The scheduler, for every token of a sequence after its first: seconds since its previous token.
  void token_interval(double seconds);
  void batch_step(size_t sequences, size_t tokens);
  // The scheduler, when a sequence ends cancelled: the model steps it ran after its cancel was set.
  void steps_after_cancel(uint64_t steps);
  void rejected(const std::string& why);  // queue full, shutting down, ...

  using RequestKey = std::tuple<std::string, std::string, int>;  // route, method, status
  struct Snapshot {
    uint64_t requests = 0;
    std::map<RequestKey, uint64_t> by_request;
    std::map<std::string, Histogram> request_seconds;  // by route
    Histogram ttft, inter_token;
    double latency_p50 = 0, latency_p99 = 0;           // API requests, seconds (last 4096)
    double ttft_p50 = 0, ttft_p99 = 0;                 // time to first token (last 4096)
    uint64_t generations = 0, prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
    std::map<std::string, uint64_t> finishes;          // finish reason -> generations
    uint64_t steps = 0, step_tokens = 0;
    std::map<size_t, uint64_t> batch_sizes;            // sequences per step -> steps
    size_t max_batch_seen = 0;
    uint64_t cancelled_sequences = 0, steps_after_cancel = 0, max_steps_after_cancel = 0;
    std::map<std::string, uint64_t> rejections;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  Snapshot s_;
  std::vector<double> latencies_, ttfts_;  // rings, for the percentiles of /v1/pool
  size_t lat_next_ = 0, ttft_next_ = 0;
};

}  // namespace towers::daemon
