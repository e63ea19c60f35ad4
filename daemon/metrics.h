// Request counters and latency percentiles for /v1/pool and /metrics. Thread-safe.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace towers::daemon {

class Metrics {
 public:
  void request_done(const std::string& route, int status, double seconds);
  void generation_done(int prompt_tokens, int cached_tokens, int completion_tokens, double first_token_s);
  void batch_step(size_t sequences, size_t tokens);
  void rejected(const std::string& why);  // queue full, shutting down, ...

  struct Snapshot {
    uint64_t requests = 0;
    std::map<std::string, uint64_t> by_route_status;  // "POST /v1/chat/completions 200" -> n
    double latency_p50 = 0, latency_p99 = 0;           // whole requests, seconds (last 4096)
    double ttft_p50 = 0, ttft_p99 = 0;                 // generation requests: time to first token
    uint64_t generations = 0, prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
    uint64_t steps = 0, step_tokens = 0;
    std::map<size_t, uint64_t> batch_sizes;            // sequences per step -> steps
    size_t max_batch_seen = 0;
    std::map<std::string, uint64_t> rejections;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  Snapshot s_;
  std::vector<double> latencies_, ttfts_;  // rings
  size_t lat_next_ = 0, ttft_next_ = 0;
};

}  // namespace towers::daemon
