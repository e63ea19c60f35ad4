// Eviction policies on a trace: a store of segments under a RAM budget serving many sessions, each
// policy of mmapstore/eviction.h choosing what leaves RAM. Prints, per policy, the hit rate, the bytes
// read back from the warm tier, and the modelled lease latency (p50/p99) when misses are read back
// from disk (warm) or re-prefilled (cold).
//
//   bench_policy [--seed S] [--hours H] [--warmup-hours W] [--bots K] [--zipf Z] [--session-rate R]
//                [--ws-ratio X] [--prefill-tok-s P] [--disk-gbs G | --disk-mb M --disk-dir D]
//                [--pin-fan-out F] [--pin-levels L] [--transcript q8|f16]
//
// The trace (deterministic for a seed; its own generators, not <random>'s distributions, whose
// output differs between standard libraries):
//  - one platform segment (1000 tokens, Q4), 8 communities (500, Q6), K bots (500, Q8) spread over
//    the communities; sizes are Llama-3.2-1B's KV (16 layers, 8 KV heads, head_dim 64) in the store's
//    own formats (simd::kv_vec_bytes): Q4 10 KiB, Q6 14 KiB, Q8 17 KiB, F16 32 KiB per token;
//  - sessions arrive as a Poisson process (R per second) on a bot drawn from Zipf(Z) over K bots;
//    turns per session are Pareto (alpha 1.3, capped at 400: most sessions are short, a few very
//    long), the gaps between turns lognormal (median 60 s, sigma 1), a turn lognormal (median 150
//    tokens, sigma 0.7, 8..2000 tokens);
//  - every turn leases its tower (platform, community, bot, then every earlier turn of the session),
//    then its new turn is sealed as a segment under it (Q8 transcript) and the budget is enforced
//    with choose_victims while the path is still leased. Nothing is ever deleted: a session that
//    ended looks like one that is only quiet, as it does to towerd.
//  - the RAM budget is the time-averaged working set (the shared segments plus the transcripts of
//    sessions that will still have a turn) divided by X (default 4), measured after the warm-up.
// Modelled, not measured: the latency of a lease is only its misses' cost: bytes / disk bandwidth
// (warm: read back in one batch) or tokens / prefill rate (cold: re-prefill; flat rate, no attention
// cost growth with position), no queueing, no CPU time of the lease itself. Measured: the disk
// bandwidth (unless --disk-gbs), and the bench's own run time. Statistics count leases after the
// warm-up only.
// The last lines are, per policy:
//   bench_policy policy=P hit=H byte_hit=B read_back_gb=G warm_p50_ms=A warm_p99_ms=B cold_p50_s=C cold_p99_s=D
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "engine/generate/sampler.h"
#include "mmapstore/eviction.h"
#include "simd/kv_quant.h"

using namespace towers;
using simd::KvQuant;
using simd::kv_quant_name;
using simd::kv_vec_bytes;

namespace {

// ------------------------------------------------------------------------------------ random

// The engine's xoshiro256** (fully specified) and our own transforms: <random>'s distributions differ
// between standard libraries, and the trace must not.
struct Rng {
  Xoshiro256ss x;
  uint64_t next() { return x.next(); }
  double uniform() { return 1.0 - x.uniform(); }  // (0, 1]
  double exponential(double mean) { return -mean * std::log(uniform()); }
  double normal() { return std::sqrt(-2 * std::log(uniform())) * std::cos(2 * M_PI * uniform()); }
  double lognormal(double median, double sigma) { return median * std::exp(sigma * normal()); }
  double pareto(double xm, double alpha) { return xm / std::pow(uniform(), 1 / alpha); }
};

// Inverse CDF of Zipf(s) over 0..k-1.
struct Zipf {
  std::vector<double> cdf;
  Zipf(int k, double s) {
    double sum = 0;
    for (int i = 1; i <= k; ++i) cdf.push_back(sum += 1 / std::pow(i, s));
    for (double& c : cdf) c /= sum;
  }
  int draw(Rng& r) const {
    const auto at = std::lower_bound(cdf.begin(), cdf.end(), r.uniform()) - cdf.begin();
    return static_cast<int>(std::min<ptrdiff_t>(at, static_cast<ptrdiff_t>(cdf.size()) - 1));
  }
};

// ------------------------------------------------------------------------------------- trace

struct Options {
  uint64_t seed = 1;
  double hours = 4, warmup_hours = 0.5;
  int bots = 64, communities = 8;
  double zipf = 1.1, session_rate = 0.5, ws_ratio = 4, prefill_tok_s = 250;
  double disk_gbs = 0;  // 0: measure
  size_t disk_mb = 256;
  std::filesystem::path disk_dir = std::filesystem::temp_directory_path();
  size_t pin_fan_out = 8, pin_levels = 0;
  KvQuant transcript = KvQuant::Q8;
};

// Llama-3.2-1B: 16 layers x 8 KV heads x (K and V) vectors of head_dim 64 per token.
size_t bytes_per_token(KvQuant q) { return 16 * 8 * 2 * kv_vec_bytes(q, 64); }

struct Turn {
  double at;
  int32_t tokens;
};
struct Session {
  int bot;
  std::vector<Turn> turns;
};
struct Trace {
  std::vector<Session> sessions;
  struct Event {
    double at;
    uint32_t session, turn;
  };
  std::vector<Event> events;  // every turn, in time order
};

Trace make_trace(const Options& o) {
  Rng rng{Xoshiro256ss(o.seed)};
  Zipf bots(o.bots, o.zipf);
  Trace tr;
  const double end = o.hours * 3600;
  for (double t = rng.exponential(1 / o.session_rate); t < end; t += rng.exponential(1 / o.session_rate)) {
    Session s;
    s.bot = bots.draw(rng);
    const int turns = static_cast<int>(std::min(400.0, std::floor(rng.pareto(1, 1.3))));
    double at = t;
    for (int k = 0; k < turns && at < end; ++k) {
      s.turns.push_back({at, static_cast<int32_t>(std::clamp(rng.lognormal(150, 0.7), 8.0, 2000.0))});
      at += rng.lognormal(60, 1.0);
    }
    tr.sessions.push_back(std::move(s));
  }
  for (uint32_t i = 0; i < tr.sessions.size(); ++i) {
    for (uint32_t k = 0; k < tr.sessions[i].turns.size(); ++k) tr.events.push_back({tr.sessions[i].turns[k].at, i, k});
  }
  std::sort(tr.events.begin(), tr.events.end(), [](const auto& a, const auto& b) {
    return a.at != b.at ? a.at < b.at : (a.session != b.session ? a.session < b.session : a.turn < b.turn);
  });
  return tr;
}

// ---------------------------------------------------------------------------------- the store

struct Seg {
  int64_t tokens;
  size_t bytes, depth;
  bool resident = true, leased = false;
  size_t children = 0;
  size_t slot = 0;  // its place in Store::resident_ while resident
  EvictionClock::time_point created, last_used;
  uint64_t uses = 0, lineage = 0;
};

struct PolicyResult {
  EvictionPolicy policy;
  uint64_t requested = 0, hits = 0, evictions = 0;
  size_t pinned_at_end = 0;  // resident bytes that could not leave (fan-out, levels) when the trace ended
  size_t bytes_requested = 0, bytes_hit = 0, read_back = 0;
  int64_t reprefill_tokens = 0;
  std::vector<double> warm_s, cold_s;  // per lease
};

EvictionClock::time_point clock_at(double s) {
  return EvictionClock::time_point(std::chrono::duration_cast<EvictionClock::duration>(std::chrono::duration<double>(s)));
}

class Store {
 public:
  Store(const Options& o, size_t budget) : o_(o), budget_(budget) {}

  size_t add(int64_t tokens, KvQuant q, size_t depth, double now, uint64_t lineage, size_t parent) {
    Seg s;
    s.tokens = tokens;
    s.bytes = static_cast<size_t>(tokens) * bytes_per_token(q);
    s.depth = depth;
    s.created = s.last_used = clock_at(now);
    s.lineage = lineage;
    if (parent != kNone) segs_[parent].children++;
    segs_.push_back(s);
    make_resident(segs_.size() - 1);
    return segs_.size() - 1;
  }
  size_t pinned_bytes() const {
    size_t b = 0;
    for (size_t i : resident_) {
      const Seg& s = segs_[i];
      b += s.children >= o_.pin_fan_out || s.depth < o_.pin_levels ? s.bytes : 0;
    }
    return b;
  }

  // Leases `path` at `now`: misses are brought back; returns the missing bytes and tokens.
  std::pair<size_t, int64_t> lease(const std::vector<size_t>& path, double now, PolicyResult& r, bool count) {
    size_t missed_bytes = 0;
    int64_t missed_tokens = 0;
    for (size_t i : path) {
      Seg& s = segs_[i];
      if (count) {
        r.requested++;
        r.bytes_requested += s.bytes;
      }
      if (s.resident) {
        if (count) r.hits++, r.bytes_hit += s.bytes;
      } else {
        missed_bytes += s.bytes;
        missed_tokens += s.tokens;
        make_resident(i);
      }
      s.last_used = clock_at(now);
      s.uses++;
    }
    return {missed_bytes, missed_tokens};
  }

  // Brings resident bytes within the budget; `leased` segments cannot leave.
  void enforce(const std::vector<size_t>& leased, double now, EvictionPolicy policy,
               const std::vector<std::pair<double, uint64_t>>& lineages, PolicyResult& r) {
    if (resident_bytes_ <= budget_) return;
    candidates_.clear();
    for (size_t i : leased) segs_[i].leased = true;
    for (size_t i : resident_) {
      const Seg& s = segs_[i];
      EvictionCandidate c;
      c.id = i + 1;
      c.bytes = s.bytes;
      c.tokens = s.tokens;
      c.depth = s.depth;
      c.leases = s.leased ? 1 : 0;
      c.fan_out = s.children;
      c.has_children = s.children > 0;
      c.created = s.created;
      c.last_used = s.last_used;
      c.uses = s.uses;
      c.lineage = s.lineage;
      if (s.lineage) {
        c.lineage_born = clock_at(lineages[s.lineage].first);
        c.lineage_uses = lineages[s.lineage].second;
      }
      candidates_.push_back(c);
    }
    for (size_t i : leased) segs_[i].leased = false;
    EvictionRules rules;
    rules.policy = policy;
    rules.now = clock_at(now);
    rules.pin_fan_out = o_.pin_fan_out;
    rules.pinned_levels = o_.pin_levels;
    for (SegmentId id : choose_victims(candidates_, rules, resident_bytes_ - budget_)) {
      evict(id - 1);
      r.evictions++;
    }
  }

  static constexpr size_t kNone = ~size_t{0};

 private:
  void make_resident(size_t i) {
    Seg& s = segs_[i];
    s.resident = true;
    s.slot = resident_.size();
    resident_.push_back(i);
    resident_bytes_ += s.bytes;
  }
  void evict(size_t i) {
    Seg& s = segs_[i];
    s.resident = false;
    resident_bytes_ -= s.bytes;
    segs_[resident_.back()].slot = s.slot;
    resident_[s.slot] = resident_.back();
    resident_.pop_back();
  }

  const Options& o_;
  size_t budget_, resident_bytes_ = 0;
  std::vector<Seg> segs_;
  std::vector<size_t> resident_;  // indices into segs_
  std::vector<EvictionCandidate> candidates_;
};

// Time-averaged bytes of what will still be used: the shared segments plus the transcripts of
// sessions with a turn to come, over [warmup, end].
double working_set(const Options& o, const Trace& tr, size_t shared_bytes) {
  const double t0 = o.warmup_hours * 3600, end = o.hours * 3600;
  const size_t per_token = bytes_per_token(o.transcript);
  std::vector<size_t> held(tr.sessions.size(), 0);
  double live = static_cast<double>(shared_bytes), integral = 0, last = t0;
  for (const auto& e : tr.events) {
    if (e.at > t0) {
      integral += live * (e.at - std::max(last, t0));
      last = e.at;
    }
    const Session& s = tr.sessions[e.session];
    if (e.turn + 1 == s.turns.size()) {
      live -= static_cast<double>(held[e.session]);  // its last turn: nothing of it is needed again
    } else {
      const size_t b = static_cast<size_t>(s.turns[e.turn].tokens) * per_token;
      held[e.session] += b;
      live += static_cast<double>(b);
    }
  }
  integral += live * (end - std::max(last, t0));
  return integral / (end - t0);
}

PolicyResult simulate(const Options& o, const Trace& tr, size_t budget, EvictionPolicy policy) {
  PolicyResult r;
  r.policy = policy;
  Store store(o, budget);
  // Lineages: 0 = none; 1..bots = the bots (born at 0); then one per session.
  std::vector<std::pair<double, uint64_t>> lineages(1 + o.bots + tr.sessions.size(), {0.0, 0});
  const size_t platform = store.add(1000, KvQuant::Q4, 0, 0, 0, Store::kNone);
  std::vector<size_t> community, bot;
  for (int c = 0; c < o.communities; ++c) community.push_back(store.add(500, KvQuant::Q6, 1, 0, 0, platform));
  for (int b = 0; b < o.bots; ++b) bot.push_back(store.add(500, KvQuant::Q8, 2, 0, 1 + b, community[b % o.communities]));
  std::vector<std::vector<size_t>> turns(tr.sessions.size());
  const double warmup = o.warmup_hours * 3600;
  const double disk_bps = o.disk_gbs * 1e9;
  std::vector<size_t> path;
  for (const auto& e : tr.events) {
    const Session& s = tr.sessions[e.session];
    const uint64_t lineage = 1 + o.bots + e.session;
    if (e.turn == 0) lineages[lineage].first = e.at;
    lineages[lineage].second++;
    lineages[1 + s.bot].second++;
    path = {platform, community[s.bot % o.communities], bot[s.bot]};
    path.insert(path.end(), turns[e.session].begin(), turns[e.session].end());
    const bool count = e.at >= warmup;
    auto [bytes, tokens] = store.lease(path, e.at, r, count);
    if (count) {
      r.read_back += bytes;
      r.reprefill_tokens += tokens;
      r.warm_s.push_back(static_cast<double>(bytes) / disk_bps);
      r.cold_s.push_back(static_cast<double>(tokens) / o.prefill_tok_s);
    }
    const size_t sealed = store.add(s.turns[e.turn].tokens, o.transcript, 3 + e.turn, e.at, lineage, path.back());
    turns[e.session].push_back(sealed);
    path.push_back(sealed);
    store.enforce(path, e.at, policy, lineages, r);
  }
  r.pinned_at_end = store.pinned_bytes();
  return r;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// Sequential read speed of a file written here and dropped from the page cache (GB/s), or 0.
double measure_disk_gbs(const std::filesystem::path& dir, size_t mb, std::string& how) {
  const auto path = dir / ("bench_policy." + std::to_string(::getpid()) + ".tmp");
  std::vector<char> block(size_t{1} << 20);
  Rng rng{Xoshiro256ss(42)};
  for (size_t i = 0; i < block.size(); i += 8) {
    const uint64_t x = rng.next();
    std::memcpy(&block[i], &x, 8);
  }
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  if (fd < 0) return how = "cannot create " + path.string() + ": " + std::strerror(errno), 0;
  bool ok = true;
  for (size_t i = 0; i < mb && ok; ++i) ok = ::write(fd, block.data(), block.size()) == ssize_t(block.size());
  ok = ok && ::fsync(fd) == 0;
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  double gbs = 0;
  if (ok && (fd = ::open(path.c_str(), O_RDONLY)) >= 0) {
    const double t0 = bench::now_s();
    size_t total = 0;
    for (ssize_t n; (n = ::read(fd, block.data(), block.size())) > 0;) total += static_cast<size_t>(n);
    const double secs = bench::now_s() - t0;
    ::close(fd);
    if (total == mb << 20) gbs = static_cast<double>(total) / secs / 1e9;
  }
  std::filesystem::remove(path);
  how = ok ? "measured: " + std::to_string(mb) + " MB written to " + dir.string() +
                 ", fsynced, dropped from the page cache (posix_fadvise), read back in 1 MiB reads"
           : "writing " + path.string() + " failed";
  return gbs;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_policy: %s\n"
               "usage: bench_policy [--seed S] [--hours H] [--warmup-hours W] [--bots K] [--zipf Z]\n"
               "                    [--session-rate R] [--ws-ratio X] [--prefill-tok-s P]\n"
               "                    [--disk-gbs G | --disk-mb M --disk-dir D] [--pin-fan-out F] [--pin-levels L]\n"
               "                    [--transcript q8|f16]\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(("missing value for " + a).c_str());
    const char* v = argv[i + 1];
    if (a == "--seed") o.seed = std::strtoull(v, nullptr, 10);
    else if (a == "--hours") o.hours = std::atof(v);
    else if (a == "--warmup-hours") o.warmup_hours = std::atof(v);
    else if (a == "--bots") o.bots = std::atoi(v);
    else if (a == "--zipf") o.zipf = std::atof(v);
    else if (a == "--session-rate") o.session_rate = std::atof(v);
    else if (a == "--ws-ratio") o.ws_ratio = std::atof(v);
    else if (a == "--prefill-tok-s") o.prefill_tok_s = std::atof(v);
    else if (a == "--disk-gbs") o.disk_gbs = std::atof(v);
    else if (a == "--disk-mb") o.disk_mb = std::strtoull(v, nullptr, 10);
    else if (a == "--disk-dir") o.disk_dir = v;
    else if (a == "--pin-fan-out") o.pin_fan_out = std::strtoull(v, nullptr, 10);
    else if (a == "--pin-levels") o.pin_levels = std::strtoull(v, nullptr, 10);
    else if (a == "--transcript") {
      if (std::string(v) == "q8") o.transcript = KvQuant::Q8;
      else if (std::string(v) == "f16") o.transcript = KvQuant::F16;
      else usage("--transcript is q8 or f16");
    } else {
      usage(("unknown option " + a).c_str());
    }
  }
  if (o.hours <= 0 || o.warmup_hours < 0 || o.warmup_hours >= o.hours) usage("need 0 <= --warmup-hours < --hours");
  if (o.bots < 1 || o.bots > 100000 || o.session_rate <= 0 || o.session_rate > 100) usage("--bots 1..1e5, --session-rate in (0, 100]");
  if (o.ws_ratio < 1 || o.prefill_tok_s <= 0 || o.disk_gbs < 0 || o.disk_mb < 1) usage("--ws-ratio >= 1, rates > 0, --disk-mb >= 1");

  const double t_start = bench::now_s();
  std::string disk_how = "given (--disk-gbs)";
  if (o.disk_gbs == 0) {
    o.disk_gbs = measure_disk_gbs(o.disk_dir, o.disk_mb, disk_how);
    if (o.disk_gbs <= 0) {
      std::fprintf(stderr, "bench_policy: cannot measure the disk (%s); pass --disk-gbs\n", disk_how.c_str());
      return 1;
    }
  }
  const Trace tr = make_trace(o);
  size_t shared = 1000 * bytes_per_token(KvQuant::Q4) + o.communities * 500 * bytes_per_token(KvQuant::Q6) +
                  o.bots * 500 * bytes_per_token(KvQuant::Q8);
  const double ws = working_set(o, tr, shared);
  const size_t budget = static_cast<size_t>(ws / o.ws_ratio);
  size_t max_turns = 0;
  for (const auto& s : tr.sessions) max_turns = std::max(max_turns, s.turns.size());

  auto gb = [](double b) { return b / 1e9; };
  std::printf("trace (seed %llu): %.1f h simulated (statistics after %.1f h), %zu sessions on %d bots (Zipf %.2f), "
              "%zu leases, turns per session up to %zu\n",
              static_cast<unsigned long long>(o.seed), o.hours, o.warmup_hours, tr.sessions.size(), o.bots, o.zipf,
              tr.events.size(), max_turns);
  std::printf("sizes: Llama-3.2-1B KV per token Q4 %zu, Q6 %zu, Q8 %zu, F16 %zu bytes; transcripts %s; shared segments %.2f GB\n",
              bytes_per_token(KvQuant::Q4), bytes_per_token(KvQuant::Q6), bytes_per_token(KvQuant::Q8),
              bytes_per_token(KvQuant::F16), kv_quant_name(o.transcript), gb(double(shared)));
  std::printf("working set %.2f GB (time-averaged), RAM budget %.2f GB (1/%.0f); pin fan-out >= %zu, pinned levels %zu\n",
              gb(ws), gb(double(budget)), o.ws_ratio, o.pin_fan_out, o.pin_levels);
  std::printf("disk %.2f GB/s (%s); prefill %.0f tok/s (given)\n", o.disk_gbs, disk_how.c_str(), o.prefill_tok_s);
  std::printf("modelled: a lease costs only its misses (warm: bytes / disk bandwidth; cold: tokens / prefill rate)\n\n");

  std::vector<PolicyResult> results;
  for (EvictionPolicy p : {EvictionPolicy::Lru, EvictionPolicy::Lindy, EvictionPolicy::TokenLru}) {
    results.push_back(simulate(o, tr, budget, p));
  }
  std::printf("| policy | segment hit rate | byte hit rate | evictions | read back (warm) | warm lease p50 / p99 | "
              "re-prefilled (cold) | cold lease p50 / p99 |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const PolicyResult& r : results) {
    std::printf("| %s | %.1f%% | %.1f%% | %llu | %.1f GB | %.1f / %.1f ms | %.2fM tokens | %.2f / %.2f s |\n",
                std::string(to_string(r.policy)).c_str(), 100.0 * double(r.hits) / double(r.requested),
                100.0 * double(r.bytes_hit) / double(r.bytes_requested), static_cast<unsigned long long>(r.evictions),
                gb(double(r.read_back)), 1e3 * percentile(r.warm_s, 0.5), 1e3 * percentile(r.warm_s, 0.99),
                double(r.reprefill_tokens) / 1e6, percentile(r.cold_s, 0.5), percentile(r.cold_s, 0.99));
  }
  std::printf("\npinned by fan-out or level at the end of the trace: %.2f GB of the %.2f GB budget; run time %.1f s\n",
              gb(double(results[0].pinned_at_end)), gb(double(budget)), bench::now_s() - t_start);
  for (const PolicyResult& r : results) {
    std::printf("bench_policy policy=%s hit=%.4f byte_hit=%.4f read_back_gb=%.3f warm_p50_ms=%.2f warm_p99_ms=%.2f "
                "cold_p50_s=%.3f cold_p99_s=%.3f\n",
                std::string(to_string(r.policy)).c_str(), double(r.hits) / double(r.requested),
                double(r.bytes_hit) / double(r.bytes_requested), gb(double(r.read_back)), 1e3 * percentile(r.warm_s, 0.5),
                1e3 * percentile(r.warm_s, 0.99), percentile(r.cold_s, 0.5), percentile(r.cold_s, 0.99));
  }
  return 0;
}
