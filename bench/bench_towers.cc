// Towers of segments: storage per session as sessions grow (seed Theorem 14), time to assemble a tower
// against the length of its shared base, and attention drift by segment depth and KV format (seed
// §9.3 item 3).
//
//   bench_towers [--model M.gguf] [--drift-model M.gguf] [--threads T] [--runs R] [--tail N] [--all-real]
//                [--timing-threads T] [--no-drift]
//   bench_towers --edit-drift [--repair R] [--edit insert|rewrite-end] [--drift-model M.gguf] [--threads T]
//
// --model: the model for storage and timing (e.g. `towerctl model synth --shape llama3.2-1b --type q4_0
// -o /tmp/1b.gguf`); without it the "tiny" synthetic shape is written to a temporary file.
// --drift-model: the model for the drift table (default <shared>/models/stories260K.gguf with TinyStories
// text; else --model with synthetic tokens).
// --all-real: prefill every shared segment of the hierarchy (61 segments, 31000 tokens) instead of one
// per level (affordable on small models only).
// --edit-drift: issue 16's quality number alone, on the drift model (0.2 s on stories260K): a bot reused under
// its edited platform with its first R tokens repaired (default 16, the daemon's `[modular]
// repair_tokens`) against recomputing it (bench/modular_quality.h, the setup of tests/test_modular.cc's
// "edited parent": 8 passages, platform 100 tokens, bot 60, the 80 tokens after it compared; F32 KV,
// Reference kernels). --edit picks the edit: its platform's last 20 tokens replaced by 30 others
// (rewrite-end, the default: the text right before the bot changes, as an appended sentence does) or
// 30 tokens inserted 20 before its end (insert). Prints what it measured on stderr and exactly one line
// on stdout, then exits:
//   edit_drift r=R kl=K top1=P          (K: mean KL in nats; P: top-1 agreement in percent)
// The last line is exactly:
//   towers n_sessions=N bytes_per_session=B per_session_cache_bytes=C assemble_us_1k=X assemble_us_4k=Y assemble_us_16k=Z
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench/modular_quality.h"
#include "bench/timing.h"
#include "engine/model/forward.h"
#include "engine/model/rope.h"
#include "engine/model/segment.h"
#include "engine/model/synth.h"
#include "engine/text/passages.h"
#include "engine/text/tokenizer.h"

using namespace towers;

namespace {

using towers::bench::now_s;

// CPU time of the calling thread (what it computed, not the time it waited for a core).
double thread_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "bench_towers: %s\n", msg.c_str());
  std::exit(1);
}

std::unique_ptr<Model> load_or_die(const std::string& path) {
  auto loaded = Model::load(path);
  if (!loaded) die(loaded.error());
  return std::move(loaded.value());
}

std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("TOWERS_SHARED"); env && *env) return env;
  return TOWERS_SHARED_DEFAULT;
}

std::string human(double bytes) {
  char buf[64];
  if (bytes >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6) std::snprintf(buf, sizeof buf, "%.2f MB", bytes / 1e6);
  else if (bytes >= 1e3) std::snprintf(buf, sizeof buf, "%.1f kB", bytes / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  return buf;
}

// Bytes a segment of n tokens holds in `format` (Segment::kv_bytes, by formula): K and V codes for
// every layer, row and KV head, plus the per-channel key scales of the quantized formats.
size_t segment_bytes(const ModelConfig& c, KvQuant format, int64_t n) {
  const size_t vec = simd::kv_vec_bytes(format, c.head_dim);
  const bool scales = format == KvQuant::Q8 || format == KvQuant::Q6 || format == KvQuant::Q4;
  return size_t(2) * c.n_layer * n * c.n_head_kv * vec + (scales ? size_t(c.n_layer) * c.kv_dim() * sizeof(float) : 0);
}

// Deterministic token ids spread over the vocabulary (BOS first when `bos` >= 0).
std::vector<int32_t> synth_tokens(const ModelConfig& c, int n, uint32_t salt, int32_t bos) {
  std::vector<int32_t> ids(n);
  uint32_t x = 2166136261u ^ salt;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    ids[i] = static_cast<int32_t>((x >> 8) % uint32_t(c.n_vocab));
  }
  if (bos >= 0 && n > 0) ids[0] = bos;
  return ids;
}

std::shared_ptr<const Segment> prefill_segment(Forward& fwd, const ModelConfig& c,
                                               const std::vector<std::shared_ptr<const Segment>>& parents,
                                               const std::vector<int32_t>& tokens, KvQuant format, SegmentId id,
                                               double* seconds) {
  Tower t(c, parents, static_cast<int32_t>(tokens.size()));
  std::vector<float> logits;
  const double t0 = now_s();
  if (auto st = fwd.eval(t, tokens, Logits::Last, logits); !st.ok()) die(st.message());
  if (seconds) *seconds += now_s() - t0;
  auto seg = t.seal_tail(tokens, format, id);
  if (!seg) die("seal_tail failed");
  return seg;
}

struct Hierarchy {
  static constexpr int kPlatformTokens = 1000, kCommunities = 10, kCommunityTokens = 500;
  static constexpr int kBots = 50, kBotTokens = 500, kTranscriptTokens = 200;
  static constexpr int kContext = kPlatformTokens + kCommunityTokens + kBotTokens + kTranscriptTokens;
};

// ---------------------------------------------------------------------------------------------------
// Drift: one segment of a 3-level tower quantized, the others F32; the transcript's next-token
// logits against an all-F32 tower of the same tokens.

std::vector<std::vector<int32_t>> drift_passages(const Model& model, int count, int n, bool* real_text) {
  auto out = corpus_passages(model.tokenizer(), shared_dir() / "corpora/tinystories_val_subset.txt", count, n);
  *real_text = static_cast<int>(out.size()) == count;
  if (static_cast<int>(out.size()) < count) {
    out.clear();
    for (int i = 0; i < count; ++i) out.push_back(synth_tokens(model.config(), n, 77 + i, model.tokenizer().bos()));
  }
  return out;
}

void drift_table(const std::string& path, int threads) {
  const auto loaded = load_or_die(path);
  const Model& model = *loaded;
  const ModelConfig& c = model.config();
  ThreadPool pool(threads);
  Forward fwd(model, pool, Kernels::Reference);
  const std::vector<int> len = {100, 60, 60};  // platform, community, bot
  const int transcript = 80, total = 300, count = 6;
  bool real_text = false;
  auto ps = drift_passages(model, count, total, &real_text);
  const int V = c.n_vocab;
  const KvQuant formats[] = {KvQuant::F16, KvQuant::Q8, KvQuant::Q6, KvQuant::Q4};
  // err[f][d]: sums of |dlogit|^2 and |logit|^2, KL, top-1 disagreements; d == 3: the depth policy.
  struct Acc {
    double d2 = 0, r2 = 0, kl = 0, flips = 0;
    int n = 0;
  };
  std::vector<std::vector<Acc>> acc(5, std::vector<Acc>(4));
  // The sealed transcript segment in F16, in Q8, and the whole default policy with it.
  const KvQuant kSealedFormats[] = {KvQuant::F16, KvQuant::Q8};
  std::vector<Acc> sealed(3);
  // The RoPE shift of a kept turn against its re-prefill, the turn stored in F32 and in Q8.
  const KvQuant kShiftFormats[] = {KvQuant::F32, KvQuant::Q8};
  std::vector<Acc> shift(2);
  DepthPolicy policy;
  auto compare = [&](Acc& a, const std::vector<float>& want, const std::vector<float>& got) {
    for (size_t r = 0; r < want.size() / V; ++r) {
      const float* p = &want[r * V];
      const float* q = &got[r * V];
      const double mp = *std::max_element(p, p + V), mq = *std::max_element(q, q + V);
      double zp = 0, zq = 0;
      for (int i = 0; i < V; ++i) {
        a.d2 += double(p[i] - q[i]) * (p[i] - q[i]);
        a.r2 += double(p[i]) * p[i];
        zp += std::exp(p[i] - mp), zq += std::exp(q[i] - mq);
      }
      double kl = 0;
      for (int i = 0; i < V; ++i) {
        const double lp = p[i] - mp - std::log(zp), lq = q[i] - mq - std::log(zq);
        kl += std::exp(lp) * (lp - lq);
      }
      a.kl += std::max(kl, 0.0);
      a.flips += (std::max_element(p, p + V) - p) != (std::max_element(q, q + V) - q);
      ++a.n;
    }
  };
  for (const auto& ids : ps) {
    // One monolithic prefill gives the F32 rows of every segment; segments of any format are cut from it.
    DenseKvCache mono(c, total);
    std::vector<float> logits;
    if (auto st = fwd.eval(mono, std::span<const int32_t>(ids.data(), total - transcript), Logits::Last, logits); !st.ok()) {
      die(st.message());
    }
    auto cut = [&](int depth, KvQuant f) {
      int from = 0;
      for (int d = 0; d < depth; ++d) from += len[d];
      std::vector<int32_t> toks(ids.begin() + from, ids.begin() + from + len[depth]);
      return Segment::from_cache(c, mono, from, std::move(toks), f, 10 + depth, depth == 0 ? 0 : 9 + depth);
    };
    auto run = [&](const std::vector<KvQuant>& f) {
      Tower t(c, {cut(0, f[0]), cut(1, f[1]), cut(2, f[2])}, transcript);
      std::vector<float> out;
      if (auto st = fwd.eval(t, std::span<const int32_t>(ids.data() + total - transcript, transcript), Logits::All, out);
          !st.ok()) {
        die(st.message());
      }
      return out;
    };
    const auto want = run({KvQuant::F32, KvQuant::F32, KvQuant::F32});
    for (int fi = 0; fi < 4; ++fi) {
      for (int d = 0; d < 3; ++d) {
        std::vector<KvQuant> f = {KvQuant::F32, KvQuant::F32, KvQuant::F32};
        f[d] = formats[fi];
        compare(acc[fi][d], want, run(f));
      }
      compare(acc[fi][3], want, run({formats[fi], formats[fi], formats[fi]}));
    }
    compare(acc[4][3], want, run({policy.at_depth(0), policy.at_depth(1), policy.at_depth(2)}));
    // A sealed transcript segment: the transcript's first half stored in a format (4th segment, after
    // the bot), its second half evaluated after it; against the same tower all in F32.
    auto cut_transcript = [&](KvQuant f) {
      const int from = len[0] + len[1] + len[2];
      std::vector<int32_t> toks(ids.begin() + from, ids.begin() + from + transcript / 2);
      return Segment::from_cache(c, mono, from, std::move(toks), f, 13, 12);
    };
    auto run_sealed = [&](const std::vector<KvQuant>& f) {
      Tower t(c, {cut(0, f[0]), cut(1, f[1]), cut(2, f[2]), cut_transcript(f[3])}, transcript / 2);
      std::vector<float> out;
      const int from = total - transcript / 2;
      if (auto st = fwd.eval(t, std::span<const int32_t>(ids.data() + from, transcript / 2), Logits::All, out); !st.ok()) {
        die(st.message());
      }
      return out;
    };
    if (auto st = fwd.eval(mono, std::span<const int32_t>(ids.data() + total - transcript, transcript / 2),
                           Logits::Last, logits);
        !st.ok()) {
      die(st.message());
    }
    const auto want_sealed = run_sealed({KvQuant::F32, KvQuant::F32, KvQuant::F32, KvQuant::F32});
    for (int k = 0; k < 2; ++k) {
      compare(sealed[k], want_sealed, run_sealed({KvQuant::F32, KvQuant::F32, KvQuant::F32, kSealedFormats[k]}));
    }
    compare(sealed[2], want_sealed, run_sealed({policy.at_depth(0), policy.at_depth(1), policy.at_depth(2), policy.transcript}));

    // A long session drops its oldest turn (issue 12): tokens [0, 100) stay (the bot's segments), the
    // turn [100, 160) goes, the kept turn [160, 220) moves to position 100, and [220, 260) is evaluated
    // after it. The daemon RoPE-shifts the kept turn's KV (computed with the dropped turn in its
    // context); the alternative is re-prefilling it at 100 without that context. Both against each other.
    {
      DenseKvCache full(c, total);
      std::vector<float> ignored;
      if (auto st = fwd.eval(full, std::span<const int32_t>(ids.data(), 220), Logits::Last, ignored); !st.ok()) die(st.message());
      DenseKvCache kept(c, total);
      std::vector<int32_t> kept_ids(ids.begin(), ids.begin() + 100);
      kept_ids.insert(kept_ids.end(), ids.begin() + 160, ids.begin() + 220);
      if (auto st = fwd.eval(kept, kept_ids, Logits::Last, ignored); !st.ok()) die(st.message());
      const Rope rope(c);
      auto base = Segment::from_cache(c, kept, 0, std::vector<int32_t>(ids.begin(), ids.begin() + 100), KvQuant::F32, 20, 0);
      auto eval_after = [&](std::shared_ptr<const Segment> turn) {
        Tower t(c, {base, std::move(turn)}, 40);
        std::vector<float> out;
        if (auto st = fwd.eval(t, std::span<const int32_t>(ids.data() + 220, 40), Logits::All, out); !st.ok()) die(st.message());
        return out;
      };
      const std::vector<int32_t> turn_ids(ids.begin() + 160, ids.begin() + 220);
      const auto reprefilled = eval_after(Segment::from_cache(c, kept, 100, turn_ids, KvQuant::F32, 21, 20));
      for (int k = 0; k < 2; ++k) {
        auto computed = Segment::from_cache(c, full, 160, turn_ids, kShiftFormats[k], 22, 0);
        compare(shift[k], reprefilled, eval_after(computed->shifted(100, rope, 23, 20)));
      }
    }
  }
  std::printf("\n== Drift by depth and bits (MEASURED) ==\n");
  std::printf("model %s (%s), %d passages (%s), tower: depth 0 = %d tokens (BOS first), depth 1 = %d, depth 2 = %d,\n"
              "then %d transcript tokens evaluated (F32 tail). One segment quantized, the others F32; compared with\n"
              "the all-F32 tower over the transcript's %d next-token distributions: relative L2 error of the\n"
              "logits ||l - l_f32|| / ||l_f32||, mean KL(f32 || quantized) in nats, top-1 flips.\n",
              std::filesystem::path(path).filename().c_str(), c.arch_name.c_str(), count,
              real_text ? "TinyStories text" : "synthetic tokens", len[0], len[1], len[2], transcript,
              count * transcript);
  std::printf("%-6s %-5s | %-28s | %-28s | %-28s | %-28s\n", "format", "bits", "depth 0 (platform)",
              "depth 1 (community)", "depth 2 (bot)", "all three");
  std::printf("%-6s %-5s | %10s %10s %6s | %10s %10s %6s | %10s %10s %6s | %10s %10s %6s\n", "", "/elt",
              "rel L2", "KL", "flips", "rel L2", "KL", "flips", "rel L2", "KL", "flips", "rel L2", "KL", "flips");
  for (int fi = 0; fi < 4; ++fi) {
    const double bits = 8.0 * simd::kv_vec_bytes(formats[fi], c.head_dim) / c.head_dim;
    std::printf("%-6s %5.2f |", simd::kv_quant_name(formats[fi]), bits);
    for (int d = 0; d < 4; ++d) {
      const Acc& a = acc[fi][d];
      std::printf(" %10.3e %10.3e %6.0f |", std::sqrt(a.d2 / a.r2), a.kl / a.n, a.flips);
    }
    std::printf("\n");
  }
  const Acc& a = acc[4][3];
  std::printf("depth policy (%s/%s/%s at depth 0/1/2): rel L2 %.3e, KL %.3e, flips %.0f of %d\n",
              simd::kv_quant_name(policy.at_depth(0)), simd::kv_quant_name(policy.at_depth(1)),
              simd::kv_quant_name(policy.at_depth(2)), std::sqrt(a.d2 / a.r2), a.kl / a.n, a.flips, a.n);
  std::printf("sealed transcript segment (%d tokens after the bot, the next %d evaluated after it), against the same\n"
              "tower in F32: rel L2 / KL / flips of %d distributions\n",
              transcript / 2, transcript / 2, sealed[0].n);
  for (int k = 0; k < 3; ++k) {
    const Acc& t = sealed[k];
    std::printf("  %-44s %10.3e %10.3e %6.0f\n",
                k < 2 ? (std::string("transcript ") + simd::kv_quant_name(kSealedFormats[k]) + ", the rest F32").c_str()
                      : (std::string("default policy (") + simd::kv_quant_name(policy.at_depth(0)) + "/" +
                         simd::kv_quant_name(policy.at_depth(1)) + "/" + simd::kv_quant_name(policy.at_depth(2)) +
                         ", transcript " + simd::kv_quant_name(policy.transcript) + ")").c_str(),
                std::sqrt(t.d2 / t.r2), t.kl / t.n, t.flips);
  }
  std::printf("RoPE shift vs re-prefill (a session drops a 60-token turn; the next 60-token turn moves from position\n"
              "160 to 100 by the shift, its KV computed with the dropped turn in context; against re-prefilling it at\n"
              "100 without it; the %d distributions of the 40 tokens after it): rel L2 / KL / top-1 flips\n",
              shift[0].n);
  for (int k = 0; k < 2; ++k) {
    const Acc& t = shift[k];
    std::printf("  kept turn %-4s %10.3e %10.3e %6.0f (top-1 agreement %.1f%%)\n", simd::kv_quant_name(kShiftFormats[k]),
                std::sqrt(t.d2 / t.r2), t.kl / t.n, t.flips, 100.0 * (1.0 - t.flips / std::max(1, t.n)));
  }
  std::printf("error ratio per 2 bits (seed: x4 per 2 bits):");
  for (int d = 0; d < 3; ++d) {
    auto rel = [&](int fi) { return std::sqrt(acc[fi][d].d2 / acc[fi][d].r2); };
    std::printf("  depth %d: q6/q8 %.2f, q4/q6 %.2f;", d, rel(2) / rel(1), rel(3) / rel(2));
  }
  std::printf("\n");
}

// Issue 16: one line, `edit_drift r=R kl=K top1=P` (see the top of this file).
void edit_drift(const std::string& path, int threads, int32_t repair, modular_quality::Edit edit) {
  namespace mq = modular_quality;
  const auto loaded = load_or_die(path);
  const Model& model = *loaded;
  const ModelConfig& c = model.config();
  ThreadPool pool(threads);
  Forward fwd(model, pool, Kernels::Reference);
  const mq::EditShape shape;
  if (repair < 0 || repair > shape.child) {
    die("--repair must be between 0 and the bot's " + std::to_string(shape.child) + " tokens");
  }
  bool real_text = false;
  const auto ps = drift_passages(model, 9, shape.passage(), &real_text);
  mq::Agreement agreement;
  for (size_t k = 0; k + 1 < ps.size(); ++k) {
    auto edited = mq::edited_parent(fwd, c, ps[k], ps[k + 1], edit, shape);
    if (!edited.ok()) die(edited.error());
    auto tower = mq::place_child(fwd, c, edited.value(), repair);
    if (!tower.ok()) die(tower.error());
    std::vector<float> got;
    if (auto st = fwd.eval(*tower.value(), edited->continuation, Logits::All, got); !st.ok()) die(st.message());
    if (!agreement.add(edited->want, got, c.n_vocab)) die("logits of different sizes");
  }
  std::fprintf(stderr,
               "edit drift: %s, %zu passages (%s), platform %d tokens edited (%s), bot %d tokens reused with %d "
               "repaired, against recomputing it: %d next-token distributions (F32 KV, Reference kernels)\n",
               std::filesystem::path(path).filename().c_str(), ps.size() - 1,
               real_text ? "TinyStories text" : "synthetic tokens", shape.parent, mq::edit_name(edit), shape.child,
               repair, agreement.count);
  std::printf("edit_drift r=%d kl=%.2e top1=%.1f\n", repair, agreement.kl(), 100 * agreement.top1());
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows when piped to a file
  std::string model_path, drift_path;
  int threads = 0, runs = 21, tail = 64, timing_threads = 1;
  bool all_real = false, drift = true, edit_drift_only = false;
  int32_t repair = 16;
  auto edit = modular_quality::Edit::RewriteEnd;
  std::vector<int> session_counts = {10, 100, 1000, 10000};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--model") model_path = next();
    else if (a == "--drift-model") drift_path = next();
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--runs") runs = std::max(3, std::atoi(next().c_str()));
    else if (a == "--tail") tail = std::max(2, std::atoi(next().c_str()));
    else if (a == "--timing-threads") timing_threads = std::max(1, std::atoi(next().c_str()));
    else if (a == "--all-real") all_real = true;
    else if (a == "--no-drift") drift = false;
    else if (a == "--edit-drift") edit_drift_only = true;
    else if (a == "--repair") repair = std::atoi(next().c_str());
    else if (a == "--edit") {
      const std::string e = next();
      if (e == "insert") edit = modular_quality::Edit::Insert;
      else if (e == "rewrite-end") edit = modular_quality::Edit::RewriteEnd;
      else die("--edit is insert or rewrite-end, not " + e);
    }
    else if (a == "--help" || a == "-h") {
      std::printf("bench_towers [--model M.gguf] [--drift-model M.gguf] [--threads T] [--runs R] [--tail N] [--timing-threads T] [--all-real] [--no-drift]\n"
                  "bench_towers --edit-drift [--repair R] [--edit insert|rewrite-end] [--drift-model M.gguf] [--threads T]\n");
      return 0;
    } else {
      die("unknown option " + a);
    }
  }
  if (drift_path.empty()) {
    const auto p = shared_dir() / "models/stories260K.gguf";
    if (std::filesystem::exists(p)) drift_path = p.string();
  }
  if (edit_drift_only && drift_path.empty()) drift_path = model_path;  // may still be empty: the synthetic model
  if (edit_drift_only && !drift_path.empty()) {
    edit_drift(drift_path, threads, repair, edit);
    return 0;
  }
  std::filesystem::path tmp_model;
  if (model_path.empty()) {
    tmp_model = std::filesystem::temp_directory_path() / ("bench_towers-tiny-" + std::to_string(::getpid()) + ".gguf");
    SynthOptions so;
    so.shape = "tiny";
    so.type = "q4_0";
    so.out = tmp_model.string();
    so.shared_dir = shared_dir().string();
    if (auto st = synthesize_model(so); !st.ok()) die(st.message());
    model_path = tmp_model.string();
  }
  if (edit_drift_only) {
    edit_drift(model_path, threads, repair, edit);
    std::filesystem::remove(tmp_model);
    return 0;
  }
  const auto loaded = load_or_die(model_path);
  const Model& model = *loaded;
  const ModelConfig& c = model.config();
  ThreadPool pool(threads);
  Forward fwd(model, pool, Kernels::Fast);
  const DepthPolicy policy;
  const int32_t bos = model.tokenizer().bos();
  std::printf("model %s: %s, n_layer %d, n_head_kv %d, head_dim %d (kv_dim %d), %d threads, Fast kernels\n",
              std::filesystem::path(model_path).filename().c_str(), c.arch_name.c_str(), c.n_layer, c.n_head_kv,
              c.head_dim, c.kv_dim(), pool.size());
  std::printf("hierarchy: 1 platform x %d tokens (%s), %d communities x %d (%s), %d bots x %d (%s, %d per community),\n"
              "sessions: %d-token transcripts (%s when sealed), session i on bot i %% %d; context per session %d tokens\n",
              Hierarchy::kPlatformTokens, simd::kv_quant_name(policy.at_depth(0)), Hierarchy::kCommunities,
              Hierarchy::kCommunityTokens, simd::kv_quant_name(policy.at_depth(1)), Hierarchy::kBots,
              Hierarchy::kBotTokens, simd::kv_quant_name(policy.at_depth(2)), Hierarchy::kBots / Hierarchy::kCommunities,
              Hierarchy::kTranscriptTokens, simd::kv_quant_name(policy.transcript), Hierarchy::kBots, Hierarchy::kContext);

  // ---- Real segments: one per level (all of them with --all-real), their kv_bytes() checked against
  // the formula used for the totals.
  std::printf("\n== Real segments (MEASURED: prefilled, Segment::kv_bytes) ==\n");
  double prefill_s = 0;
  int prefill_tokens = 0;
  SegmentId next_id = 1;
  auto platform = prefill_segment(fwd, c, {}, synth_tokens(c, Hierarchy::kPlatformTokens, 1, bos), policy.at_depth(0),
                                  next_id++, &prefill_s);
  prefill_tokens += Hierarchy::kPlatformTokens;
  const int n_comm = all_real ? Hierarchy::kCommunities : 1;
  const int bots_per = Hierarchy::kBots / Hierarchy::kCommunities;
  std::vector<std::shared_ptr<const Segment>> communities, bots;
  for (int i = 0; i < n_comm; ++i) {
    communities.push_back(prefill_segment(fwd, c, {platform}, synth_tokens(c, Hierarchy::kCommunityTokens, 100 + i, -1),
                                          policy.at_depth(1), next_id++, &prefill_s));
    prefill_tokens += Hierarchy::kCommunityTokens;
    for (int b = 0; b < (all_real ? bots_per : 1); ++b) {
      bots.push_back(prefill_segment(fwd, c, {platform, communities.back()},
                                     synth_tokens(c, Hierarchy::kBotTokens, 1000 + i * bots_per + b, -1),
                                     policy.at_depth(2), next_id++, &prefill_s));
      prefill_tokens += Hierarchy::kBotTokens;
    }
  }
  auto transcript = prefill_segment(fwd, c, {platform, communities[0], bots[0]},
                                    synth_tokens(c, Hierarchy::kTranscriptTokens, 5000, -1), policy.transcript,
                                    next_id++, &prefill_s);
  prefill_tokens += Hierarchy::kTranscriptTokens;
  struct Check {
    const char* level;
    const Segment& s;
  };
  bool formula_ok = true;
  for (const Check& ch : {Check{"platform", *platform}, Check{"community", *communities[0]}, Check{"bot", *bots[0]},
                          Check{"transcript", *transcript}}) {
    const size_t f = segment_bytes(c, ch.s.format(), ch.s.length());
    formula_ok &= f == ch.s.kv_bytes();
    std::printf("  %-10s %5d tokens %-3s kv_bytes %10zu (%s)  formula %10zu  %s\n", ch.level, ch.s.length(),
                simd::kv_quant_name(ch.s.format()), ch.s.kv_bytes(), human(ch.s.kv_bytes()).c_str(), f,
                f == ch.s.kv_bytes() ? "equal" : "DIFFERENT");
  }
  if (!formula_ok) die("segment byte formula does not match Segment::kv_bytes");
  size_t real_shared = platform->kv_bytes();
  for (auto& s : communities) real_shared += s->kv_bytes();
  for (auto& s : bots) real_shared += s->kv_bytes();
  std::printf("  prefilled %d segments, %d tokens in %.1f s (%.1f tok/s)\n", 2 + n_comm + int(bots.size()),
              prefill_tokens, prefill_s, prefill_tokens / prefill_s);

  // ---- Bytes per session.
  const size_t b_platform = segment_bytes(c, policy.at_depth(0), Hierarchy::kPlatformTokens);
  const size_t b_comm = segment_bytes(c, policy.at_depth(1), Hierarchy::kCommunityTokens);
  const size_t b_bot = segment_bytes(c, policy.at_depth(2), Hierarchy::kBotTokens);
  const size_t b_transcript = segment_bytes(c, policy.transcript, Hierarchy::kTranscriptTokens);
  const size_t shared = b_platform + Hierarchy::kCommunities * b_comm + Hierarchy::kBots * b_bot;
  if (all_real && real_shared != shared) die("real shared bytes differ from the formula");
  const size_t per_session_cache = segment_bytes(c, KvQuant::F16, Hierarchy::kContext);
  std::printf("\n== KV bytes per session (COMPUTED from the exact byte formula of each format, checked above;\n"
              "   shared segments %s) ==\n",
              all_real ? "all 61 prefilled for real (sum of kv_bytes equals the formula)"
                       : "by formula, one per level prefilled");
  std::printf("shared hierarchy: platform %s + communities %d x %s + bots %d x %s = %s (held once)\n",
              human(b_platform).c_str(), Hierarchy::kCommunities, human(b_comm).c_str(), Hierarchy::kBots,
              human(b_bot).c_str(), human(shared).c_str());
  std::printf("per session: transcript %d tokens %s = %s (the floor |B_dyn|); a live request adds an F32 tail of\n"
              "  %s per token of reply room, for the sessions decoding at that moment only\n",
              Hierarchy::kTranscriptTokens, simd::kv_quant_name(policy.transcript), human(b_transcript).c_str(),
              human(segment_bytes(c, KvQuant::F32, 1)).c_str());
  std::printf("per-session cache (llama.cpp style: each session keeps its whole %d-token context at F16): %s\n",
              Hierarchy::kContext, human(per_session_cache).c_str());
  std::printf("%8s | %14s %14s %14s | %14s %9s | %14s | %14s %7s\n", "sessions", "shared (all)", "transcripts",
              "total", "bytes/session", "/floor", "shared in use", "per-sess cache", "saving");
  double last_bps = 0;
  int last_n = 0;
  for (int n : session_counts) {
    const int bots_used = std::min(n, Hierarchy::kBots);
    const int comm_used = std::min(Hierarchy::kCommunities, (bots_used + bots_per - 1) / bots_per);
    const size_t in_use = b_platform + size_t(comm_used) * b_comm + size_t(bots_used) * b_bot;
    const size_t total = shared + size_t(n) * b_transcript;
    const double bps = double(total) / n;
    std::printf("%8d | %14zu %14zu %14zu | %14.0f %9.3f | %14zu | %14zu %6.1fx\n", n, shared, size_t(n) * b_transcript,
                total, bps, bps / b_transcript, in_use, per_session_cache, per_session_cache / bps);
    last_bps = bps;
    last_n = n;
  }
  std::printf("(shared (all): all 61 shared segments resident; shared in use: only those the sessions' bots need.\n"
              " bytes/session = (shared (all) + transcripts) / sessions -> transcript bytes at O(1/N).)\n");

  // ---- Assembly: Tower from existing segments + first decode step, minus a plain decode step.
  // Timed on a pool of --timing-threads threads (default 1: the steps run on this thread, so its CPU
  // clock counts what was computed and not the time spent waiting for a core on a shared machine).
  ThreadPool timing_pool(timing_threads);
  Forward timing_fwd(model, timing_pool, Kernels::Fast);
  const bool cpu_clock = timing_pool.size() == 1;
  std::printf("\n== Tower assembly (MEASURED, median of %d runs, %d thread%s, tail room %d tokens) ==\n", runs,
              timing_pool.size(), timing_pool.size() == 1 ? "" : "s", tail);
  std::printf("The base is the real %d-token platform segment (%s) and copies of it re-rotated with\n"
              "Segment::shifted to where they are placed (so rope_delta = 0, as in an exact tower); the KV bytes\n"
              "attention reads are what a real base of that length and format holds. Runs go round-robin over\n"
              "the bases, alternating which step comes first. Times in us of %s.\n",
              Hierarchy::kPlatformTokens, simd::kv_quant_name(platform->format()),
              cpu_clock ? "this thread's CPU clock (wall clock in the last column)" : "the wall clock");
  Rope rope(c);
  std::vector<std::shared_ptr<const Segment>> copies = {platform};
  double assemble_us[3] = {0, 0, 0};
  const int bases[3] = {1000, 4000, 16000};
  std::vector<std::vector<std::shared_ptr<const Segment>>> base_segs(3);
  std::vector<std::unique_ptr<Tower>> warm(3);  // assembled once: its steps are the plain ones
  const int32_t tok = static_cast<int32_t>(7 % c.n_vocab);
  std::vector<float> logits;
  auto step = [&](Tower& t) {
    if (auto st = timing_fwd.eval(t, std::span<const int32_t>(&tok, 1), Logits::Last, logits); !st.ok()) {
      die(st.message());
    }
  };
  auto clock = [&] { return cpu_clock ? thread_cpu_s() : now_s(); };
  for (int bi = 0; bi < 3; ++bi) {
    const int copies_needed = bases[bi] / Hierarchy::kPlatformTokens;
    while (static_cast<int>(copies.size()) < copies_needed) {
      copies.push_back(platform->shifted(static_cast<int32_t>(copies.size()) * Hierarchy::kPlatformTokens, rope,
                                         next_id++));
    }
    base_segs[bi].assign(copies.begin(), copies.begin() + copies_needed);
    warm[bi] = std::make_unique<Tower>(c, base_segs[bi], tail);
  }
  std::vector<std::vector<double>> construct(3), first(3), plain(3), paired(3), wall(3);
  for (int r = 0; r < runs + 1; ++r) {
    for (int bi = 0; bi < 3; ++bi) {
      double fresh_us = 0, construct_us = 0, plain_us = 0, fresh_wall = 0, plain_wall = 0;
      for (int order = 0; order < 2; ++order) {
        if ((order == 0) == (r % 2 == 0)) {
          const double w0 = now_s(), t0 = clock();
          Tower t(c, base_segs[bi], tail);
          const double t1 = clock();
          step(t);
          const double t2 = clock(), w2 = now_s();
          construct_us = (t1 - t0) * 1e6;
          fresh_us = (t2 - t0) * 1e6;
          fresh_wall = (w2 - w0) * 1e6;
        } else {
          Tower& t = *warm[bi];
          t.truncate(t.base_length());
          const double w0 = now_s(), t0 = clock();
          step(t);
          plain_us = (clock() - t0) * 1e6;
          plain_wall = (now_s() - w0) * 1e6;
        }
      }
      if (r == 0) continue;  // warm-up
      construct[bi].push_back(construct_us);
      first[bi].push_back(fresh_us);
      plain[bi].push_back(plain_us);
      paired[bi].push_back(fresh_us - plain_us);
      wall[bi].push_back(fresh_wall - plain_wall);
    }
  }
  std::printf("%7s %10s | %12s %13s %13s | %12s %12s %12s | %14s\n", "base", "base KV", "construct", "first step",
              "plain step", "med - med", "assemble", "min - min", "assemble wall");
  for (int bi = 0; bi < 3; ++bi) {
    size_t base_bytes = 0;
    for (auto& s : base_segs[bi]) base_bytes += s->kv_bytes();
    assemble_us[bi] = median(paired[bi]);
    std::printf("%7d %10s | %12.1f %13.1f %13.1f | %12.1f %12.1f %12.1f | %14.1f\n", bases[bi],
                human(base_bytes).c_str(), median(construct[bi]), median(first[bi]), median(plain[bi]),
                median(first[bi]) - median(plain[bi]), assemble_us[bi],
                *std::min_element(first[bi].begin(), first[bi].end()) -
                    *std::min_element(plain[bi].begin(), plain[bi].end()),
                median(wall[bi]));
  }
  std::printf("(construct = Tower constructor; first step = constructor + first decode step of the new tower; plain\n"
              " step = a decode step at the same context on a tower assembled before; assemble = median over runs of\n"
              " (first step - plain step) of the same run; med - med = median(first) - median(plain); min - min =\n"
              " fastest first minus fastest plain; assemble wall = assemble on the wall clock. A decode step varies\n"
              " by a few %% run to run on a shared machine: differences of that size are noise, construct is exact.)\n");
  {
    std::vector<double> big;
    for (int r = 0; r < runs; ++r) {
      const double t0 = now_s();
      Tower t(c, copies, 1024);
      big.push_back((now_s() - t0) * 1e6);
    }
    std::printf("(construct grows with the tail room, not the base: the tail is a zero-filled F32 cache of\n"
                " %s per token; with 1024 tokens of room the constructor alone takes %.1f us wall, mostly page\n"
                " faults of the fresh allocation)\n",
                human(segment_bytes(c, KvQuant::F32, 1)).c_str(), median(big));
  }

  // ---- Drift.
  if (drift_path.empty()) drift_path = model_path;
  if (drift) drift_table(drift_path, threads);

  if (!tmp_model.empty()) std::filesystem::remove(tmp_model);
  std::printf("\ntowers n_sessions=%d bytes_per_session=%.0f per_session_cache_bytes=%zu assemble_us_1k=%.1f "
              "assemble_us_4k=%.1f assemble_us_16k=%.1f\n",
              last_n, last_bps, per_session_cache, assemble_us[0], assemble_us[1], assemble_us[2]);
  return 0;
}
