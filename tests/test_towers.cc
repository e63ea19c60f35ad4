// Towers of segments against monolithic prefill: exact composition, RoPE shift both ways, and the
// quality cost of quantized segments (KL divergence of next-token distributions).
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "engine/model/forward.h"
#include "engine/model/segment.h"
#include "engine/text/tokenizer.h"
#include "model_fixtures.h"
#include "test_support.h"

using namespace towers;

namespace {

using test::eval_all;
using test::load_shared;
using test::max_abs_diff;
using test::passages;

// Builds platform/community/bot segments from cuts of `ids` by prefilling each under its parents.
std::vector<std::shared_ptr<const Segment>> build_segments(const Model& model, Forward& fwd,
                                                           std::span<const int32_t> ids,
                                                           const std::vector<int>& cuts,
                                                           const std::vector<KvQuant>& formats) {
  Tower t(model.config(), {}, static_cast<int32_t>(ids.size()));
  int from = 0;
  for (size_t i = 0; i < cuts.size(); ++i) {
    std::span<const int32_t> part = ids.subspan(from, cuts[i] - from);
    std::vector<float> logits;
    REQUIRE(fwd.eval(t, part, Logits::Last, logits).ok());
    REQUIRE(t.seal_tail({part.begin(), part.end()}, formats[i], 100 + i) != nullptr);
    from = cuts[i];
  }
  return t.segments();
}

std::vector<int32_t> greedy_tail(const Model& model, Forward& fwd, KvCache& cache, std::vector<float> logits, int n) {
  std::vector<int32_t> out;
  const int V = model.config().n_vocab;
  for (int i = 0; i < n; ++i) {
    const float* last = logits.data() + logits.size() - V;
    int32_t best = static_cast<int32_t>(std::max_element(last, last + V) - last);
    out.push_back(best);
    REQUIRE(fwd.eval(cache, std::span<const int32_t>(&best, 1), Logits::Last, logits).ok());
  }
  return out;
}

}  // namespace

TEST_CASE("exact mode: a tower of 3 segments + transcript equals monolithic prefill") {
  for (const char* rel : {"models/stories260K.gguf", "models/babyllama105.gguf"}) {
    CAPTURE(rel);
    auto model = load_shared(rel);
    if (!model) return;
    auto ps = passages(*model, 2, 200);
    if (ps.empty()) return;
    ThreadPool pool(2);
    Forward fwd(*model, pool, Kernels::Reference);
    for (const auto& ids : ps) {
      DenseKvCache mono(model->config(), 300);
      auto want = eval_all(fwd, mono, ids);
      const int V = model->config().n_vocab;

      auto segs = build_segments(*model, fwd, ids, {50, 90, 150}, {KvQuant::F32, KvQuant::F32, KvQuant::F32});
      REQUIRE(segs.size() == 3);
      CHECK(segs[1]->parent() == segs[0]->id());
      // Another session composes the same three segments and prefills only its transcript.
      Tower tower(model->config(), segs, 150);
      CHECK(tower.size() == 150);
      std::span<const int32_t> transcript(ids.data() + 150, ids.size() - 150);
      auto got = eval_all(fwd, tower, transcript);
      std::vector<float> want_tail(want.begin() + 150 * size_t(V), want.end());
      double err = max_abs_diff(got, want_tail);
      MESSAGE(rel << ": max |tower - monolithic| logit = " << err);
      CHECK(err < 1e-4);

      // Identical greedy continuations of 64 tokens.
      std::vector<float> last(got.end() - V, got.end());
      auto a = greedy_tail(*model, fwd, tower, last, 64);
      std::vector<float> mlast(want.end() - V, want.end());
      auto b = greedy_tail(*model, fwd, mono, mlast, 64);
      CHECK(a == b);

      // F16 segments stay close too.
      auto segs16 = build_segments(*model, fwd, ids, {50, 90, 150}, {KvQuant::F16, KvQuant::F16, KvQuant::F16});
      Tower t16(model->config(), segs16, 60);
      CHECK(max_abs_diff(eval_all(fwd, t16, transcript), want_tail) < 2e-2);
    }
  }
}

TEST_CASE("RoPE shift: relative invariance, rotate-K equals recomputing at the new position, and the "
          "zero-copy query rotation agrees with rotate-K") {
  auto model = load_shared("models/stories260K.gguf");
  if (!model) return;
  auto ps = passages(*model, 1, 120);
  if (ps.empty()) return;
  const auto& ids = ps[0];
  ThreadPool pool(2);
  Forward fwd(*model, pool, Kernels::Reference);
  const int32_t delta = 37;
  // Same tokens at [0, n) and [delta, delta + n): same logits (attention sees relative positions).
  DenseKvCache at0(model->config(), 130), atd(model->config(), 130, delta);
  auto l0 = eval_all(fwd, at0, ids), ld = eval_all(fwd, atd, ids);
  CHECK(max_abs_diff(l0, ld) < 1e-4);

  // K computed at 0 and rotated by delta equals K computed at delta.
  const std::vector<int32_t> toks(ids.begin(), ids.end());
  auto seg0 = Segment::from_cache(model->config(), at0, 0, toks, KvQuant::F32, 1, 0);
  auto segd = Segment::from_cache(model->config(), atd, 0, toks, KvQuant::F32, 2, 0);
  Rope rope(model->config());
  auto moved = seg0->shifted(delta, rope, 3);
  double kerr = 0;
  for (int l = 0; l < model->config().n_layer; ++l) {
    for (int32_t r = 0; r < seg0->length(); ++r) {
      auto a = moved->key_row(l, r), b = segd->key_row(l, r);
      for (size_t e = 0; e < a.size(); ++e) kerr = std::max(kerr, double(std::abs(a[e] - b[e])));
    }
  }
  MESSAGE("max |rotate(K@0, delta) - K@delta| = " << kerr);
  CHECK(kerr < 1e-4);

  // A segment computed at delta, used at 0: rotate-K copy vs zero-copy query counter-rotation.
  auto back = segd->shifted(0, rope, 4);
  Tower zero_copy(model->config(), {segd}, 16), copied(model->config(), {back}, 16);
  std::vector<KvSpan> sp;
  zero_copy.spans(0, 0, sp);
  CHECK(sp[0].rope_delta == -delta);
  copied.spans(0, 0, sp);
  CHECK(sp[0].rope_delta == 0);
  const std::vector<int32_t> more = {ids[5], ids[6], ids[7], ids[8]};
  auto a = eval_all(fwd, zero_copy, more), b = eval_all(fwd, copied, more);
  CHECK(max_abs_diff(a, b) < 1e-4);
  // And both equal continuing the monolithic cache computed at 0.
  auto c = eval_all(fwd, at0, more);
  CHECK(max_abs_diff(a, c) < 1e-4);
}

TEST_CASE("Segment::join: rows of several segments, each RoPE-shifted to where it lands, as one segment") {
  auto model = load_shared("models/stories260K.gguf");
  if (!model) return;
  auto ps = passages(*model, 1, 60);
  if (ps.empty()) return;
  const std::vector<int32_t> toks(ps[0].begin(), ps[0].end());
  const int32_t n = static_cast<int32_t>(toks.size()), cut = 16, delta = 23;
  ThreadPool pool(1);
  Forward fwd(*model, pool, Kernels::Reference);
  DenseKvCache at0(model->config(), n), atd(model->config(), n, delta);
  (void)eval_all(fwd, at0, toks);
  (void)eval_all(fwd, atd, toks);
  auto seg0 = Segment::from_cache(model->config(), at0, 0, toks, KvQuant::F32, 1, 0);
  auto segd = Segment::from_cache(model->config(), atd, 0, toks, KvQuant::F32, 2, 0);
  Rope rope(model->config());
  // The first rows computed at delta (a repair, in place), the rest computed at 0 and moved there:
  // the keys of the whole equal those computed at delta.
  const Segment::Rows rows[] = {{segd.get(), 0, cut}, {seg0.get(), cut, n}};
  auto joined = Segment::join(rows, delta, rope, KvQuant::F32, 3, 7);
  REQUIRE(joined);
  CHECK(joined->tokens() == toks);
  CHECK(joined->computed_pos() == delta);
  CHECK(joined->parent() == 7);
  double kerr = 0;
  for (int l = 0; l < model->config().n_layer; ++l) {
    for (int32_t r = 0; r < n; ++r) {
      auto a = joined->key_row(l, r), b = segd->key_row(l, r);
      for (size_t e = 0; e < a.size(); ++e) kerr = std::max(kerr, double(std::abs(a[e] - b[e])));
    }
  }
  CHECK(kerr < 1e-4);
  // Quantized: the same bytes as quantizing the F32 whole (the scales span every row joined).
  const Segment::Rows whole[] = {{joined.get(), 0, n}};
  auto q8 = Segment::join(whole, delta, rope, KvQuant::Q8, 4, 7);
  const Segment::Rows pieces[] = {{segd.get(), 0, cut}, {seg0.get(), cut, n}};
  auto q8_direct = Segment::join(pieces, delta, rope, KvQuant::Q8, 4, 7);
  REQUIRE(q8);
  REQUIRE(q8_direct);
  CHECK(std::ranges::equal(q8->k_bytes(), q8_direct->k_bytes()));
  CHECK(std::ranges::equal(q8->v_bytes(), q8_direct->v_bytes()));
  CHECK(std::ranges::equal(q8->k_scales(), q8_direct->k_scales()));
  // Rows out of range are refused.
  const Segment::Rows bad[] = {{seg0.get(), cut, n + 1}};
  CHECK(Segment::join(bad, 0, rope, KvQuant::F32, 5, 0) == nullptr);
}

TEST_CASE("quantized towers: KL divergence and top-1 agreement against F32 KV") {
  auto model = load_shared("models/stories260K.gguf");
  if (!model) return;
  auto ps = passages(*model, 6, 300);
  if (ps.empty()) return;
  ThreadPool pool(2);
  Forward fwd(*model, pool, Kernels::Reference);
  const int V = model->config().n_vocab;
  const std::vector<int> cuts = {100, 160, 220};
  struct Config {
    const char* name;
    std::vector<KvQuant> formats;
  };
  DepthPolicy policy;
  const std::vector<Config> configs = {
      {"Q8", {KvQuant::Q8, KvQuant::Q8, KvQuant::Q8}},
      {"Q6", {KvQuant::Q6, KvQuant::Q6, KvQuant::Q6}},
      {"Q4", {KvQuant::Q4, KvQuant::Q4, KvQuant::Q4}},
      {"depth-adaptive", {policy.at_depth(0), policy.at_depth(1), policy.at_depth(2)}},
  };
  auto softmax = [&](const float* l) {
    std::vector<double> p(V);
    double mx = *std::max_element(l, l + V), sum = 0;
    for (int i = 0; i < V; ++i) sum += p[i] = std::exp(double(l[i]) - mx);
    for (auto& x : p) x /= sum;
    return p;
  };
  std::map<std::string, std::pair<double, double>> result;  // name -> (mean KL, top-1 agreement)
  for (const auto& cfg : configs) {
    double kl_sum = 0, agree = 0;
    int count = 0;
    for (const auto& ids : ps) {
      std::span<const int32_t> transcript(ids.data() + cuts.back(), ids.size() - cuts.back());
      auto ref_segs = build_segments(*model, fwd, ids, cuts, {KvQuant::F32, KvQuant::F32, KvQuant::F32});
      Tower ref(model->config(), ref_segs, 100);
      auto want = eval_all(fwd, ref, transcript);
      auto segs = build_segments(*model, fwd, ids, cuts, cfg.formats);
      Tower t(model->config(), segs, 100);
      auto got = eval_all(fwd, t, transcript);
      for (size_t r = 0; r < transcript.size(); ++r) {
        auto p = softmax(&want[r * V]), q = softmax(&got[r * V]);
        double kl = 0;
        for (int i = 0; i < V; ++i) {
          if (p[i] > 0) kl += p[i] * std::log(p[i] / std::max(q[i], 1e-300));
        }
        kl_sum += kl;
        agree += (std::max_element(p.begin(), p.end()) - p.begin()) == (std::max_element(q.begin(), q.end()) - q.begin());
        ++count;
      }
    }
    result[cfg.name] = {kl_sum / count, agree / count};
    MESSAGE(cfg.name << ": mean KL " << kl_sum / count << " nats, top-1 agreement " << 100 * agree / count << "%");
  }
  CHECK(result["Q8"].first <= 1e-3);
  CHECK(result["depth-adaptive"].first <= 1e-2);
  CHECK(result["Q8"].second >= 0.97);
  // More bits never hurt on average.
  CHECK(result["Q8"].first <= result["Q6"].first);
  CHECK(result["Q6"].first <= result["Q4"].first);
}

TEST_CASE("F16 lease tails: half the bytes, every row rounded as it is stored, so a prompt fed at once "
          "or token by token gives the same logits, close to F32 tails; sealed into an F16 segment unchanged") {
  for (const char* rel : {"models/stories260K.gguf", "models/babyllama105.gguf"}) {
    CAPTURE(rel);
    auto model = load_shared(rel);
    if (!model) return;
    auto ps = passages(*model, 1, 150);
    if (ps.empty()) return;
    const auto& ids = ps[0];
    const int V = model->config().n_vocab;
    ThreadPool pool(2);
    for (Kernels kernels : {Kernels::Reference, Kernels::Fast}) {
      Forward fwd(*model, pool, kernels);
      DenseKvCache f32(model->config(), 200), at_once(model->config(), 200, 0, KvQuant::F16),
          one_by_one(model->config(), 200, 0, KvQuant::F16);
      CHECK(at_once.bytes() * 2 == f32.bytes());
      const auto want = eval_all(fwd, f32, ids);
      const auto got = eval_all(fwd, at_once, ids);
      std::vector<float> stepped, logits;
      for (int32_t id : ids) {
        REQUIRE(fwd.eval(one_by_one, std::span<const int32_t>(&id, 1), Logits::Last, logits).ok());
        stepped.insert(stepped.end(), logits.end() - V, logits.end());
      }
      CHECK(max_abs_diff(got, stepped) == 0.0);
      // As an F16 segment of the same rows would (the drift table's F16 row, docs/numerics.md).
      const double err = max_abs_diff(got, want);
      double peak = 0;
      for (float x : want) peak = std::max(peak, std::abs(double(x)));
      MESSAGE(std::string(rel) << ": max |f16 tail - f32 tail| logit = " << err << " of max |logit| " << peak);
      CHECK(err < 2e-3 * peak);
    }
    // A tower's F16 tail sealed into an F16 segment keeps its rows bit for bit (the next tower reads
    // the same numbers the tail held).
    Forward fwd(*model, pool, Kernels::Reference);
    Tower t(model->config(), {}, 150, KvQuant::F16);
    CHECK(t.tail_format() == KvQuant::F16);
    std::vector<float> logits;
    REQUIRE(fwd.eval(t, std::span<const int32_t>(ids.data(), 100), Logits::Last, logits).ok());
    DenseKvCache copy(model->config(), 100, 0, KvQuant::F16);
    REQUIRE(fwd.eval(copy, std::span<const int32_t>(ids.data(), 100), Logits::Last, logits).ok());
    auto seg = t.seal_tail({ids.begin(), ids.begin() + 100}, KvQuant::F16, 7);
    REQUIRE(seg != nullptr);
    std::vector<KvSpan> spans;
    copy.spans(0, 0, spans);
    REQUIRE(spans.size() == 1);
    const KvSpan s = seg->span(0, 0);
    REQUIRE(s.row_bytes == spans[0].row_bytes);
    CHECK(std::memcmp(s.k, spans[0].k, 100 * s.row_bytes) == 0);
    CHECK(std::memcmp(s.v, spans[0].v, 100 * s.row_bytes) == 0);
  }
}
