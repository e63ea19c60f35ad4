#include "mmapstore/compressor.h"

#include <pthread.h>
#include <sched.h>

namespace towers {

Compressor::Compressor(SegmentPool& pool, const Model& model, Encode encode, Options options)
    : pool_(pool), forward_(model, threads_), encode_(std::move(encode)), options_(options) {}

Compressor::~Compressor() { stop(); }

void Compressor::start() {
  std::lock_guard lock(mu_);
  if (thread_.joinable()) return;
  stop_.store(false);
  thread_ = std::thread([this] { loop(); });
}

void Compressor::stop() {
  {
    std::lock_guard lock(mu_);
    stop_.store(true);
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Compressor::loop() {
  if (options_.idle_priority) {
    sched_param param{};
    param.sched_priority = 0;
    (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &param);  // best effort: unprivileged is fine
  }
  std::unique_lock lock(mu_);
  while (!stop_.load()) {
    lock.unlock();
    if (options_.while_over_disk_budget) compress_over_disk_budget(options_.idle_for);
    else compress_idle(options_.idle_for);
    lock.lock();
    stats_.scans++;
    wake_.wait_for(lock, options_.scan_every, [this] { return stop_.load(); });
  }
}

size_t Compressor::compress_idle(std::chrono::steady_clock::duration idle_for) {
  return compress_idle_while(idle_for, [] { return true; });
}

size_t Compressor::compress_over_disk_budget(std::chrono::steady_clock::duration idle_for) {
  return compress_idle_while(idle_for, [this] { return pool_.disk_over_budget() > 0; });
}

size_t Compressor::compress_idle_while(std::chrono::steady_clock::duration idle_for, const std::function<bool()>& needed) {
  // Checked before the idle list too: a scan within the budget costs no pass over the pool.
  if (!needed()) return 0;
  size_t n = 0;
  for (SegmentId id : pool_.idle(idle_for)) {
    if (stop_.load() || !needed()) break;
    if (compress(id).ok()) ++n;
  }
  return n;
}

Status Compressor::compress(SegmentId id) {
  std::lock_guard work(work_mu_);
  auto info = pool_.info(id);
  if (!info) return Status::Error("unknown segment " + std::to_string(id));
  if (info->tier == Tier::Cold) return Status::Error("segment " + std::to_string(id) + " is cold already");
  auto seq = pool_.sequence(id);
  if (!seq.ok()) return seq.status();
  const std::vector<int32_t>& all = seq.value();
  const size_t begin = static_cast<size_t>(info->begin);
  if (begin > all.size()) return Status::Error("internal: segment " + std::to_string(id) + " starts past its sequence");
  const auto t0 = std::chrono::steady_clock::now();
  auto coded = encode_(forward_, std::span(all).first(begin), std::span(all).subspan(begin));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard lock(mu_);
  stats_.seconds += secs;
  if (!coded.ok()) {
    stats_.failed++;
    stats_.last_error = "segment " + std::to_string(id) + ": " + coded.error();
    return coded.status();
  }
  const size_t bytes = coded.value().size();
  Status st = pool_.freeze(id, std::move(coded.value()));
  if (!st.ok()) {
    stats_.skipped++;  // leased or pinned meanwhile: try again next scan
    return st;
  }
  stats_.compressed++;
  stats_.tokens += all.size() - begin;
  stats_.coded_bytes += bytes;
  return Status::Ok();
}

Compressor::Stats Compressor::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace towers
