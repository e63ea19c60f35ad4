// Restart without prefill (issue 11): how long a towerd holding N bot segments takes from its start to
// an open socket, and to the first reply on a bot nobody has touched since the restart.
//
//   bench_restart [--towerd BIN] [--model M.gguf] [--n N] [--tokens T] [--dir DIR] [--keep]
//
// 1. Builds a state directory with towerd's own code (daemon/open_state.h: the catalog writes the
//    records, the pool's writer the segment files): one platform and one community segment and N bot
//    segments under them, ~T tokens each. Their KV is synthetic (random rows of the right shape,
//    quantized by Segment::from_cache in each depth's format, the bytes of one bot reused for all), so
//    that building 1000 bots takes seconds instead of hours of prefill; towerd checks the files exactly
//    as it would check its own. Untimed.
// 2. Drops the files from the page cache (posix_fadvise DONTNEED; no root needed), starts towerd on the
//    directory and times: start -> /healthz answers (start_ms), and start -> the reply to one message
//    of a new session on the middle bot (first_reply_ms). The reply must not have prefilled the bot:
//    its prompt's cached tokens must cover the bot's whole chain.
// Defaults: the synthetic Llama-3.2-1B Q4_0 file (written to DIR first if --model is not given), N =
// 1000, T = 500, DIR a temporary directory under /var/tmp (removed unless --keep). Last line exactly:
//   restart n_segments=N store_bytes=B start_ms=S first_reply_ms=F
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <tuple>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/synth_1b.h"
#include "cli/http_client.h"
#include "daemon/open_state.h"
#include "engine/model/segment.h"

extern char** environ;

namespace fs = std::filesystem;
using namespace towers;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

namespace {

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

int fail(const std::string& message) {
  std::fprintf(stderr, "bench_restart: %s\n", message.c_str());
  return 1;
}

// `words` words of text for bot i.
std::string bot_text(int i, int words) {
  static const char* kWords[] = {"river", "stone", "lantern", "garden", "thunder", "velvet", "harbor", "meadow",
                                 "copper", "whisper", "orchard", "glacier", "ember", "canyon", "willow", "falcon"};
  std::mt19937 rng(static_cast<uint32_t>(i) * 2654435761u + 1);
  std::string s = "You are bot " + std::to_string(i) + ".";
  for (int w = 0; w < words; ++w) s += std::string(" ") + kWords[rng() % 16];
  return s;
}

// The KV of `length` rows computed at `pos`, random, quantized in `format` (one per depth).
Segment::Parts synthetic_parts(const ModelConfig& c, int32_t pos, int32_t length, KvQuant format) {
  DenseKvCache cache(c, length, pos);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> k(c.kv_dim()), v(c.kv_dim());
  for (int l = 0; l < c.n_layer; ++l) {
    for (int32_t r = 0; r < length; ++r) {
      for (int d = 0; d < c.kv_dim(); ++d) k[d] = normal(rng), v[d] = normal(rng);
      cache.put_pending(l, r, k.data(), v.data());
    }
  }
  cache.commit(length);
  auto seg = Segment::from_cache(c, cache, 0, std::vector<int32_t>(static_cast<size_t>(length), 0), format, 1, 0);
  Segment::Parts p;
  p.computed_pos = pos;
  p.format = format;
  p.k.assign(seg->k_bytes().begin(), seg->k_bytes().end());
  p.v.assign(seg->v_bytes().begin(), seg->v_bytes().end());
  p.k_scale.assign(seg->k_scales().begin(), seg->k_scales().end());
  return p;
}

struct Store {
  uint64_t bytes = 0;          // of its segment files
  size_t probe_chain = 0;      // tokens of the probed bot's whole chain (platform + community + bot)
};

// Builds the state directory; `probe` is the bot whose chain length is returned.
Result<Store> build_store(const fs::path& dir, const std::string& model, int n, int tokens, int probe) {
  daemon::Config cfg;
  cfg.state_dir = dir;
  cfg.model_path = model;
  cfg.policy.ram_budget = daemon::BudgetSetting{uint64_t{512} << 20, 0};  // the builder itself stays small
  daemon::OpenOptions oo;
  oo.serving = true;
  std::vector<std::string> warnings;
  auto opened = daemon::open_state(cfg, oo, &warnings);
  if (!opened.ok()) return opened.status();
  daemon::OpenState& st = *opened.value();
  if (st.records == 0) {
    if (Status s = st.store->append(st.catalog->header()); !s.ok()) return s;
  }
  const ModelConfig& c = st.model->config();
  std::map<std::tuple<int32_t, int32_t, KvQuant>, Segment::Parts> synthetic;  // (pos, length, format) -> KV
  // Computes segment `id` with synthetic KV (its own tokens, its depth's format) and installs it.
  auto install = [&](SegmentId id) -> Status {
    auto info = st.pool->info(id);
    auto seq = st.pool->sequence(id);
    if (!info || !seq.ok()) return Status::Error("segment " + std::to_string(id) + " is not in the pool");
    const auto key = std::make_tuple(info->begin, info->length, info->format);
    auto it = synthetic.find(key);
    if (it == synthetic.end()) it = synthetic.emplace(key, synthetic_parts(c, info->begin, info->length, info->format)).first;
    Segment::Parts p = it->second;
    p.id = id;
    p.parent = info->parent;
    p.tokens.assign(seq->end() - info->length, seq->end());
    auto seg = Segment::from_parts(c, std::move(p));
    if (!seg.ok()) return seg.status();
    return st.pool->install(id, std::move(seg.value()));
  };
  auto put = [&](const std::string& name, daemon::Level level, const std::string& parent, const std::string& text) -> Status {
    auto r = st.catalog->put_segment(name, level, parent, text);
    if (!r.ok()) return r.status().prefixed("segment " + name + ": ");
    // The segment and any parent still cold: parents first.
    std::vector<SegmentId> chain;
    for (SegmentId id = r->build; id != kNoSegment;) {
      auto info = st.pool->info(id);
      if (!info || info->tier != Tier::Cold) break;
      chain.insert(chain.begin(), id);
      id = info->parent;
    }
    for (SegmentId id : chain) {
      if (Status s = install(id); !s.ok()) return s;
    }
    return Status::Ok();
  };
  // Words per token of this vocabulary, so that a bot of `tokens` tokens is that long in this model.
  const std::string sample = bot_text(0, 400);
  const size_t sample_tokens = std::max<size_t>(1, st.model->tokenizer().encode(sample, false, false).size());
  auto words = [&](int t) { return std::max(1, static_cast<int>(static_cast<double>(t) * 400 / sample_tokens)); };
  if (Status s = put("plat", daemon::Level::Platform, "", bot_text(-1, words(120))); !s.ok()) return s;
  if (Status s = put("comm", daemon::Level::Community, "plat", bot_text(-2, words(120))); !s.ok()) return s;
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    if (Status s = put("bot" + std::to_string(i), daemon::Level::Bot, "comm", bot_text(i, words(tokens))); !s.ok()) {
      return s;
    }
    if (i % 16 == 15 || i + 1 == n) {
      st.pool->flush_writes();
      st.pool->enforce_budget();
      std::fprintf(stderr, "\rbench_restart: %d/%d bots written (%.0f s)", i + 1, n, ms_since(t0) / 1000);
    }
  }
  std::fprintf(stderr, "\n");
  st.pool->flush_writes();
  Store out;
  for (const auto& e : fs::directory_iterator(dir / "segments")) out.bytes += e.file_size();
  auto probe_def = st.catalog->segment("bot" + std::to_string(probe));
  if (!probe_def.ok()) return probe_def.status();
  if (!probe_def->pool) return Status::Error("bot" + std::to_string(probe) + " is not in the pool");
  auto chain = st.pool->sequence(probe_def->pool->id);
  if (!chain.ok()) return chain.status();
  out.probe_chain = chain->size();
  return out;
}

void drop_page_cache(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Restart without prefill: start -> socket open, and -> first reply on an untouched bot, for a towerd "
               "holding N bot segments (issue 11). Last line: restart n_segments=N store_bytes=B start_ms=S first_reply_ms=F"};
  std::string towerd = (fs::path(argv[0]).parent_path() / ".." / "daemon" / "towerd").string();
  std::string model, dir_arg;
  int n = 1000, tokens = 500;
  bool keep = false;
  app.add_option("--towerd", towerd, "towerd binary (default: the build tree's)");
  app.add_option("--model", model, "GGUF (default: a synthetic Llama-3.2-1B Q4_0 written to DIR)");
  app.add_option("--n", n, "bot segments")->check(CLI::Range(1, 100000));
  app.add_option("--tokens", tokens, "tokens per bot")->check(CLI::Range(16, 8000));
  app.add_option("--dir", dir_arg, "work directory (default: a new one under /var/tmp)");
  app.add_flag("--keep", keep, "keep the work directory");
  CLI11_PARSE(app, argc, argv);

  fs::path dir = dir_arg.empty() ? fs::path("/var/tmp") / ("bench_restart." + std::to_string(::getpid())) : fs::path(dir_arg);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fail("cannot create " + dir.string() + ": " + ec.message());
  if (model.empty()) {
    auto synth = bench::synthetic_llama_1b(dir);
    if (!synth.ok()) return fail(synth.error());
    model = synth.value();
  }
  const fs::path state = dir / "state";
  const int probe = n / 2;
  auto store = build_store(state, model, n, tokens, probe);
  if (!store.ok()) return fail("building the store: " + store.error());
  std::printf("store: %d bot segments, %.2f GB of segment files in %s; bot%d's chain is %zu tokens\n", n,
              static_cast<double>(store->bytes) / 1e9, state.c_str(), probe, store->probe_chain);
  drop_page_cache(state);

  const std::string sock = (dir / "towerd.sock").string();
  const std::string log = (dir / "towerd.log").string();
  std::vector<std::string> args = {towerd, "--model", model, "--state-dir", state.string(), "--socket", sock};
  std::vector<char*> argv_c;
  for (auto& a : args) argv_c.push_back(a.data());
  argv_c.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const auto t0 = Clock::now();
  pid_t pid = 0;
  if (posix_spawn(&pid, towerd.c_str(), &fa, nullptr, argv_c.data(), environ) != 0) return fail("cannot start " + towerd);
  posix_spawn_file_actions_destroy(&fa);
  auto stop = [&] {
    ::kill(pid, SIGTERM);
    int status = 0;
    ::waitpid(pid, &status, 0);
  };
  cli::HttpClient client(sock, 600);
  double start_ms = -1;
  while (start_ms < 0) {  // bounded readiness poll: 10 ms steps, at most 10 minutes
    try {
      if (client.request("GET", "/healthz").status == 200) start_ms = ms_since(t0);
    } catch (const cli::ClientError&) {
    }
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return fail("towerd exited during its start; see " + log);
    if (ms_since(t0) > 600000) {
      stop();
      return fail("towerd not ready after 10 minutes");
    }
    if (start_ms < 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string bot = "bot" + std::to_string(probe);
  double first_ms = -1;
  json reply;
  try {
    auto s = client.request("POST", "/v1/sessions", json{{"bot", bot}, {"id", "first"}}.dump());
    if (s.status != 200 && s.status != 201) throw cli::ClientError("session: " + s.body);
    auto r = client.request("POST", "/v1/sessions/first/messages",
                            json{{"content", "Hello!"}, {"max_tokens", 1}, {"temperature", 0}}.dump());
    first_ms = ms_since(t0);
    if (r.status != 200) throw cli::ClientError("message: " + r.body);
    reply = json::parse(r.body);
  } catch (const std::exception& e) {
    stop();
    return fail(e.what());
  }
  stop();
  const int64_t prompt = reply["usage"]["prompt_tokens"].get<int64_t>();
  const int64_t cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  std::printf("first reply on %s: prompt %lld tokens, %lld from segment files, %lld prefilled\n", bot.c_str(),
              static_cast<long long>(prompt), static_cast<long long>(cached), static_cast<long long>(prompt - cached));
  if (!keep) fs::remove_all(dir, ec);
  // Whatever was prefilled must be the message and its template only: the bot's whole chain came from files.
  if (cached < static_cast<int64_t>(store->probe_chain)) return fail("the first reply prefilled part of the bot's chain");
  std::printf("restart n_segments=%d store_bytes=%llu start_ms=%.0f first_reply_ms=%.0f\n", n,
              static_cast<unsigned long long>(store->bytes), start_ms, first_ms);
  return 0;
}
