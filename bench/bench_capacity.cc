// What a session at rest costs on this machine (issue 24, Benchmark): N sessions at rest under one
// platform and 10 bots, each a transcript of T tokens, kept by towerd's own store code.
//
//   bench_capacity [--sessions N] [--tokens T] [--record-bytes B] [--dir DIR] [--keep]
//                  [--wake-model M.gguf | --no-wake] [--wake-tokens W] [--chunk C]
//                  [--coder-model C.gguf | --small-coder]
//
// 1. Build (untimed, in a child process): the cold packs (mmapstore/cold_pack.h, what SegmentPool
//    writes when a session goes to rest) get one coded record per session, appended in batches as the
//    compressor's freezes append them. The records are SYNTHETIC bytes of the right size (B; default
//    the design card's 1.5 KB per 4000 tokens, scaled by T): here they are only stored, indexed and
//    counted, never decoded. Their index entries are real: parent bot, token count T, a 64-bit hash.
// 2. Restart (timed, in a fresh child process): a SegmentPool over the store (its constructor reads
//    the packs' index, not one record), the platform and the bots put back cold, and every session
//    adopted at rest (SegmentPool::adopt_at_rest, what Catalog::restore does for each session the log
//    names). restart_ms: constructor to the last session adopted. rss_mb: the process's resident memory
//    growth over that (the model and the binary excluded). The record log's share (the sessions'
//    creation and turn records, still their text: docs/store.md) is not in this store and not counted.
// 3. Wake (the 1B shape unless --wake-model; W transcript tokens of random ids): one session's first
//    token after its next message (16 tokens), from rest (its record read from the packs, decoded
//    under the bot, prefilled) against the baseline of the same transcript prefilled from its tokens
//    (what a session kept as text costs). Both through SegmentPool (thaw), the codec as towerd runs it:
//    chunks of C tokens (default 256, [cold] chunk's), coded by the wake model itself or by a smaller
//    coder of the same vocabulary (--coder-model, or --small-coder: a synthetic one of that shape).
//
// Last line exactly:
//   capacity sessions=N tokens=T rss_mb=R disk_bytes_per_session=D restart_ms=S wake_ms=W
// (wake_ms=0 with --no-wake). The lines before it say what was measured, and the prefill baseline.
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/synth_1b.h"
#include "engine/base/thread_pool.h"
#include "engine/codec/codec.h"
#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "mmapstore/cold_pack.h"
#include "mmapstore/compressor.h"
#include "mmapstore/segment_pool.h"

namespace fs = std::filesystem;
using namespace towers;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kBots = 10;
constexpr SegmentId kPlatformId = 1, kFirstBotId = 2, kFirstSessionId = 100;
constexpr int kPlatformTokens = 200, kBotTokens = 100, kMessageTokens = 16;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

int fail(const std::string& message) {
  std::fprintf(stderr, "bench_capacity: %s\n", message.c_str());
  return 1;
}

// CPU time of this process so far (the restart's wall time on a machine busy with other jobs is
// mostly waiting for a core).
double cpu_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// Resident memory of this process, from /proc/self/statm (pages).
double rss_mb() {
  std::ifstream statm("/proc/self/statm");
  size_t size = 0, resident = 0;
  statm >> size >> resident;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int vocab) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = static_cast<int32_t>(3 + rng() % static_cast<uint32_t>(vocab - 3));
  return v;
}

SegmentId session_id(int64_t i) { return kFirstSessionId + static_cast<SegmentId>(i); }
SegmentId bot_of(int64_t i) { return kFirstBotId + static_cast<SegmentId>(i % kBots); }

SegmentOptions session_options(int64_t i) {
  SegmentOptions o;
  o.label = o.lineage = "session:" + std::to_string(i);
  return o;
}

// Runs fn in a child process; its exit status (0 = ok).
template <typename Fn>
int in_child(Fn fn) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    const int rc = fn();
    std::fflush(stdout);
    std::_Exit(rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int build(const fs::path& cold_dir, int64_t n, int tokens, size_t record_bytes) {
  auto pack = ColdPack::open(cold_dir);
  if (!pack.ok()) return fail(pack.error());
  std::mt19937_64 rng(42);
  constexpr int64_t kBatch = 8192;  // records a freeze pass appends behind one fsync of each file
  std::vector<std::vector<uint8_t>> records(kBatch, std::vector<uint8_t>(record_bytes));
  std::vector<ColdPut> puts;
  const auto t0 = Clock::now();
  for (int64_t first = 0; first < n; first += kBatch) {
    puts.clear();
    for (int64_t i = first; i < std::min(n, first + kBatch); ++i) {
      std::vector<uint8_t>& r = records[static_cast<size_t>(i - first)];
      for (size_t k = 0; k < r.size(); k += 8) {
        const uint64_t x = rng();
        for (size_t b = 0; b < 8 && k + b < r.size(); ++b) r[k + b] = static_cast<uint8_t>(x >> (8 * b));
      }
      puts.push_back({session_id(i), bot_of(i), rng(), tokens, r});
    }
    auto refs = pack.value()->append(puts);
    if (!refs.ok()) return fail("appending records: " + refs.error());
    if ((first / kBatch) % 16 == 15 || first + kBatch >= n) {
      std::fprintf(stderr, "\rbench_capacity: %lld/%lld sessions at rest (%.0f s)", static_cast<long long>(std::min(n, first + kBatch)),
                   static_cast<long long>(n), ms_since(t0) / 1000);
    }
  }
  std::fprintf(stderr, "\n");
  return 0;
}

// The restart, in a fresh process: prints "restart_ms=... rss_mb=..." for the parent to read.
int restart(const fs::path& store, const std::string& model_path, int64_t n, const fs::path& out) {
  auto model = Model::load(model_path);
  if (!model.ok()) return fail(model.error());
  ThreadPool threads(1);
  Forward forward(*model.value(), threads);
  const int vocab = model.value()->config().n_vocab;
  std::mt19937 rng(3);
  const std::vector<int32_t> platform = random_tokens(rng, kPlatformTokens, vocab);
  const double rss0 = rss_mb();
  const double cpu0 = cpu_ms();
  const auto t0 = Clock::now();
  PoolOptions po;
  po.store_dir = store;
  SegmentPool pool(*model.value(), forward, po);
  const double index_ms = ms_since(t0), index_cpu = cpu_ms() - cpu0;
  SegmentOptions o;
  o.id = kPlatformId;
  if (auto r = pool.add_cold(kNoSegment, platform, o); !r.ok()) return fail(r.error());
  for (int b = 0; b < kBots; ++b) {
    o.id = kFirstBotId + static_cast<SegmentId>(b);
    if (auto r = pool.add_cold(kPlatformId, random_tokens(rng, kBotTokens, vocab), o); !r.ok()) return fail(r.error());
  }
  for (int64_t i = 0; i < n; ++i) {
    if (Status st = pool.adopt_at_rest(session_id(i), bot_of(i), session_options(i)); !st.ok()) return fail(st.message());
  }
  const double ms = ms_since(t0);
  const double cpu = cpu_ms() - cpu0;
  const double rss = rss_mb() - rss0;
  const PoolStats s = pool.stats();
  if (s.at_rest_segments != static_cast<size_t>(n) || s.at_rest_bytes != 0) {
    return fail("the restart holds " + std::to_string(s.at_rest_segments) + " sessions at rest and " +
                std::to_string(s.at_rest_bytes) + " bytes of records in RAM");
  }
  std::printf("restart: %lld sessions at rest in %.0f ms (%.0f ms of CPU; the packs' index read in %.0f ms, %.0f of CPU); RSS +%.1f MB "
              "(the pool's records %.1f MB, trie %.1f MB, token ids in RAM %zu B; the rest: the packs' index in RAM)\n",
              static_cast<long long>(n), ms, cpu, index_ms, index_cpu, rss, static_cast<double>(s.entry_bytes) / 1048576.0,
              static_cast<double>(s.trie_bytes) / 1048576.0, s.token_bytes);
  std::ofstream(out) << ms << " " << rss << "\n";
  return 0;
}

struct Wake {
  double wake_ms = 0, prefill_ms = 0, record_bytes = 0;
  double decode_ms = 0;  // of wake_ms: reading and decoding the record
};

// The codec as the cold tier runs it: the coder model (the serving model, or a smaller one of the
// same vocabulary) with its own Forward, chunks of `chunk` tokens.
struct Coder {
  const Model& model;
  Forward& forward;
  Codec codec;
  CodecOptions options;
};

// One session of `tokens` transcript tokens under a platform and a bot: its next message's first token
// from rest (record read, decoded, prefilled) and, the baseline, from its tokens (prefilled).
Result<Wake> wake(const std::string& model_path, const std::string& coder_path, const fs::path& store, int tokens,
                  int chunk) {
  auto model = Model::load(model_path);
  if (!model.ok()) return model.status();
  const Model& m = *model.value();
  ThreadPool threads(std::max(1u, std::thread::hardware_concurrency()));
  Forward forward(m, threads);
  Result<std::unique_ptr<Model>> coder_model = coder_path.empty() ? Result<std::unique_ptr<Model>>(nullptr) : Model::load(coder_path);
  if (!coder_model.ok()) return coder_model.status();
  const Model& cm = coder_model.value() ? *coder_model.value() : m;
  if (Status st = check_same_vocabulary(m, cm); !st.ok()) return st;
  std::unique_ptr<Forward> coder_forward = coder_model.value() ? std::make_unique<Forward>(cm, threads) : nullptr;
  Coder coder{cm, coder_forward ? *coder_forward : forward, Codec(cm, &threads), {}};
  coder.options.chunk = chunk;
  std::error_code ec;
  fs::remove_all(store, ec);  // a kept work directory's earlier wake
  PoolOptions po;
  po.store_dir = store;
  SegmentPool pool(m, forward, po);
  Wake w;
  pool.set_cold_decoder([&](Forward&, std::span<const int32_t> ctx, std::span<const uint8_t> coded) {
    const auto t0 = Clock::now();
    auto out = coder.codec.decode(coder.forward, ctx, coded, coder.options);
    w.decode_ms += ms_since(t0);
    return out;
  });
  std::mt19937 rng(5);
  const int vocab = m.config().n_vocab;
  const auto platform = random_tokens(rng, kPlatformTokens, vocab), bot = random_tokens(rng, kBotTokens, vocab);
  const auto transcript = random_tokens(rng, tokens, vocab), message = random_tokens(rng, kMessageTokens, vocab);
  auto p = pool.add(kNoSegment, platform);
  if (!p.ok()) return p.status();
  auto b = pool.add(p.value(), bot);
  if (!b.ok()) return b.status();
  auto s = pool.add_cold(b.value(), transcript, session_options(0));
  if (!s.ok()) return s.status();
  std::vector<int32_t> all = platform;
  all.insert(all.end(), bot.begin(), bot.end());
  all.insert(all.end(), transcript.begin(), transcript.end());
  all.insert(all.end(), message.begin(), message.end());
  // The message after the session's tower, to its first token's logits.
  auto next_message = [&]() -> Result<double> {
    const auto t0 = Clock::now();
    if (Status st = pool.thaw(s.value()); !st.ok()) return st;
    auto lease = pool.assemble(all, 1);
    if (!lease.ok()) return lease.status();
    if (lease->cached_tokens != all.size() - message.size()) return Status::Error("the session's tower was not cached");
    std::vector<float> logits;
    Status st = forward.eval(*lease->tower, message, Logits::Last, logits);
    pool.release(*lease);
    if (!st.ok()) return st;
    return ms_since(t0);
  };
  auto baseline = next_message();  // cold with its tokens: prefilled from them
  if (!baseline.ok()) return baseline.status();
  w.prefill_ms = baseline.value();
  Compressor comp(pool, m, [&](Forward&, std::span<const int32_t> ctx, std::span<const int32_t> toks) {
    return coder.codec.encode(coder.forward, ctx, toks, coder.options);
  }, {});
  if (Status st = comp.compress(s.value()); !st.ok()) return st;
  if (!pool.at_rest(s.value()) || pool.stats().packed_segments != 1) return Status::Error("the session did not go to rest in the packs");
  w.record_bytes = static_cast<double>(pool.stats().pack_record_bytes);
  auto woken = next_message();  // at rest: read, decoded, prefilled
  if (!woken.ok()) return woken.status();
  w.wake_ms = woken.value();
  return w;
}

uint64_t dir_bytes(const fs::path& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file()) n += e.file_size();
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"What N sessions at rest cost (issue 24): RSS, disk per session, restart and wake time. Last line: "
               "capacity sessions=N tokens=T rss_mb=R disk_bytes_per_session=D restart_ms=S wake_ms=W"};
  int64_t n = 100000;
  int tokens = 4000, wake_tokens = 1000, chunk = 256;
  int64_t record_bytes = 0;
  std::string dir_arg, wake_model, coder_model;
  bool keep = false, no_wake = false, small_coder = false;
  app.add_option("--sessions", n, "sessions at rest")->check(CLI::Range(int64_t{1}, int64_t{100000000}));
  app.add_option("--tokens", tokens, "transcript tokens per session")->check(CLI::Range(1, 1 << 16));
  app.add_option("--record-bytes", record_bytes, "coded record bytes per session (default: 1.5 KB per 4000 tokens, the design card's)");
  app.add_option("--dir", dir_arg, "work directory (default: a new one under /var/tmp)");
  app.add_flag("--keep", keep, "keep the work directory");
  app.add_option("--wake-model", wake_model, "GGUF to time the wake on (default: a synthetic Llama-3.2-1B Q4_0 written to DIR)");
  app.add_option("--wake-tokens", wake_tokens, "transcript tokens of the session woken")->check(CLI::Range(16, 8000));
  app.add_flag("--no-wake", no_wake, "skip the wake (wake_ms=0)");
  app.add_option("--chunk", chunk, "codec chunk: tokens per independently decodable chunk ([cold] chunk; 0 = one chunk)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--coder-model", coder_model, "GGUF of the coder (same vocabulary as the wake model; default: the wake model itself)");
  app.add_flag("--small-coder", small_coder, "code with a synthetic small coder of Llama-3.2's vocabulary (shape llama3.2-coder: "
               "2 layers of 256; random weights, so its speed, not its compression, is what is measured)");
  CLI11_PARSE(app, argc, argv);
  if (record_bytes <= 0) record_bytes = std::max<int64_t>(1, static_cast<int64_t>(tokens) * 1536 / 4000);

  const fs::path dir = dir_arg.empty() ? fs::path("/var/tmp") / ("bench_capacity." + std::to_string(::getpid())) : fs::path(dir_arg);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fail("cannot create " + dir.string() + ": " + ec.message());
  const fs::path store = dir / "segments";
  fs::remove_all(store, ec);
  // The restart's pool needs a model for its shape only (nothing runs): the tiny synthetic one.
  const std::string tiny = (dir / "synth-tiny.gguf").string();
  if (!fs::exists(tiny)) {
    SynthOptions so;
    so.shape = "tiny";
    so.type = "q8_0";
    so.out = tiny;
    if (Status s = synthesize_model(so); !s.ok()) return fail(s.message());
  }
  std::printf("build: %lld sessions x %d tokens, synthetic coded records of %lld B each, under 1 platform and %d bots\n",
              static_cast<long long>(n), tokens, static_cast<long long>(record_bytes), kBots);
  if (in_child([&] { return build(store / "cold", n, tokens, static_cast<size_t>(record_bytes)); }) != 0) return fail("build failed");
  const uint64_t disk = dir_bytes(store);
  const double per_session = static_cast<double>(disk) / static_cast<double>(n);
  std::printf("disk: %.1f MB in %s (packs and index), %.1f B a session: %.1f B over the record (%.3fx + %.1f B)\n",
              static_cast<double>(disk) / 1e6, (store / "cold").c_str(), per_session,
              per_session - static_cast<double>(record_bytes), per_session / static_cast<double>(record_bytes),
              static_cast<double>(kColdIndexEntryBytes));

  const fs::path result = dir / "restart.txt";
  if (in_child([&] { return restart(store, tiny, n, result); }) != 0) return fail("restart failed");
  double restart_ms = 0, rss = 0;
  std::ifstream(result) >> restart_ms >> rss;

  Wake w;
  if (!no_wake) {
    if (wake_model.empty()) {
      auto synth = bench::synthetic_llama_1b(dir);
      if (!synth.ok()) return fail(synth.error());
      wake_model = synth.value();
    }
    if (small_coder && coder_model.empty()) {
      auto coder = bench::synthetic_model(dir, "llama3.2-coder", "q8_0");
      if (!coder.ok()) return fail(coder.error());
      coder_model = coder.value();
    }
    auto woken = wake(wake_model, coder_model, dir / "wake", wake_tokens, chunk);
    if (!woken.ok()) return fail("wake: " + woken.error());
    w = woken.value();
    std::printf("wake: %s, coder %s, chunk %d, %d transcript tokens (random ids: a %.0f B record), next message of %d "
                "tokens to its first token: %.0f ms from rest (read and decode %.0f, prefill %.0f) vs %.0f ms prefilled "
                "from its tokens (%.2fx)\n",
                fs::path(wake_model).filename().c_str(),
                coder_model.empty() ? "= the wake model" : fs::path(coder_model).filename().c_str(), chunk, wake_tokens,
                w.record_bytes, kMessageTokens, w.wake_ms, w.decode_ms, w.wake_ms - w.decode_ms, w.prefill_ms,
                w.wake_ms / std::max(1.0, w.prefill_ms));
  }
  if (!keep) fs::remove_all(dir, ec);
  std::printf("capacity sessions=%lld tokens=%d rss_mb=%.0f disk_bytes_per_session=%.0f restart_ms=%.0f wake_ms=%.0f\n",
              static_cast<long long>(n), tokens, rss, per_session, restart_ms, w.wake_ms);
  return 0;
}
