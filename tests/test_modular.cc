// Modular placement (engine/model/modular.h): a segment computed after BOS alone, placed under another
// prefix with a RoPE shift (Prompt Cache), with and without recomputing its first r tokens in context
// (CacheBlend-style repair). Quality against exact monolithic prefill: KL divergence and top-1
// agreement of next-token distributions over the tokens that follow the placed segment.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "bench/modular_quality.h"
#include "engine/model/forward.h"
#include "engine/model/modular.h"
#include "engine/text/tokenizer.h"
#include "model_fixtures.h"
#include "test_support.h"

using namespace towers;

namespace {

using test::eval_all;
using test::load_shared;
using test::max_abs_diff;
using test::passages;

using modular_quality::Agreement;

// Prefills `tokens` after `prefix` and seals them into one exact segment (the pool's exact mode).
std::shared_ptr<const Segment> exact_segment(const Model& model, Forward& fwd,
                                             const std::vector<std::shared_ptr<const Segment>>& prefix,
                                             std::span<const int32_t> tokens, KvQuant format, SegmentId id) {
  auto s = modular_quality::exact_segment(fwd, model.config(), prefix, tokens, format, id);
  REQUIRE_MESSAGE(s.ok(), s.error());
  return s.value();
}

}  // namespace

TEST_CASE("slice_segment keeps the bytes of its rows, and a sliced exact segment stays exact") {
  auto model = load_shared("models/stories260K.gguf");
  if (!model) return;
  auto ps = passages(*model, 1, 160);
  if (ps.empty()) return;
  const auto& ids = ps[0];
  ThreadPool pool(2);
  Forward fwd(*model, pool, Kernels::Reference);
  std::span<const int32_t> all(ids);
  auto base = exact_segment(*model, fwd, {}, all.subspan(0, 80), KvQuant::F32, 1);
  for (KvQuant f : {KvQuant::F32, KvQuant::Q4}) {
    CAPTURE(simd::kv_quant_name(f));
    auto seg = exact_segment(*model, fwd, {base}, all.subspan(80, 50), f, 2);
    auto a = slice_segment(*seg, 0, 20, 3), b = slice_segment(*seg, 20, 50, 4);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(slice_segment(*seg, 20, 20, 5) == nullptr);
    CHECK(slice_segment(*seg, 0, 51, 5) == nullptr);
    CHECK(a->length() == 20);
    CHECK(b->computed_pos() == seg->computed_pos() + 20);
    CHECK(b->tokens() == std::vector<int32_t>(ids.begin() + 100, ids.begin() + 130));
    CHECK(a->kv_bytes() + b->kv_bytes() ==
          seg->kv_bytes() + (f == KvQuant::F32 ? 0 : seg->k_scales().size() * sizeof(float)));
    for (int l = 0; l < model->config().n_layer; ++l) {
      CHECK(b->key_row(l, 3) == seg->key_row(l, 23));
    }
    Tower whole(model->config(), {base, seg}, 30), split(model->config(), {base, a, b}, 30);
    auto want = eval_all(fwd, whole, all.subspan(130, 30));
    auto got = eval_all(fwd, split, all.subspan(130, 30));
    CHECK(max_abs_diff(want, got) < 1e-4);
  }
}

TEST_CASE("modular placement: exact when fully repaired, KL and top-1 agreement of r = 0 4 16 vs exact") {
  auto model = load_shared("models/stories260K.gguf");
  if (!model) return;
  const int P = 100, M = 60, C = 80;  // prefix (with BOS), modular segment, continuation
  auto ps = passages(*model, 8, P + M + C);
  if (ps.empty()) return;
  ThreadPool pool(2);
  Forward fwd(*model, pool, Kernels::Reference);
  const ModelConfig& cfg = model->config();
  const int V = cfg.n_vocab;
  const std::vector<int32_t> repairs = {0, 4, 16};
  std::map<int32_t, Agreement> by_r;
  Agreement exact_q8;  // for scale: the cost of Q8 KV in exact mode
  for (const auto& ids : ps) {
    std::span<const int32_t> all(ids);
    DenseKvCache mono(cfg, P + M + C);
    auto ref = eval_all(fwd, mono, all);
    std::vector<float> want(ref.begin() + size_t(P + M) * V, ref.end());
    std::span<const int32_t> cont = all.subspan(P + M, C);

    auto prefix = exact_segment(*model, fwd, {}, all.subspan(0, P), KvQuant::F32, 1);
    // Exact mode is exact: the segment computed under its real parent reproduces monolithic prefill.
    auto in_context = exact_segment(*model, fwd, {prefix}, all.subspan(P, M), KvQuant::F32, 2);
    Tower exact(cfg, {prefix, in_context}, C);
    CHECK(max_abs_diff(eval_all(fwd, exact, cont), want) < 1e-4);
    Tower exact8(cfg, {prefix, exact_segment(*model, fwd, {prefix}, all.subspan(P, M), KvQuant::Q8, 2)}, C);
    REQUIRE(exact_q8.add(want, eval_all(fwd, exact8, cont), V));

    auto modular = ModularSegment::compute(fwd, cfg, ids[0], {ids.begin() + P, ids.begin() + P + M}, KvQuant::F32, 3);
    REQUIRE(modular.ok());
    const ModularSegment& mod = *modular.value();
    CHECK(mod.segment()->computed_pos() == 1);
    CHECK(mod.segment()->parent() == 0);
    CHECK(mod.rest(4) == mod.rest(4));  // cut once, shared by every placement
    CHECK(mod.rest(4)->length() == M - 4);

    // Repairing every token is an ordinary prefill: exact.
    ModularPlacement full;
    full.repair = M;
    full.tail_capacity = C;
    auto t_full = place_modular(fwd, cfg, {prefix}, mod, full);
    REQUIRE(t_full.ok());
    CHECK(t_full.value()->size() == P + M);
    CHECK(max_abs_diff(eval_all(fwd, *t_full.value(), cont), want) < 1e-4);

    for (int32_t r : repairs) {
      ModularPlacement pl;
      pl.repair = r;
      pl.tail_capacity = C;
      auto t = place_modular(fwd, cfg, {prefix}, mod, pl);
      REQUIRE(t.ok());
      Tower& tower = *t.value();
      CHECK(tower.size() == P + M);
      std::vector<KvSpan> spans;
      tower.spans(0, 0, spans);
      CHECK(spans.back().rope_delta == P + r - (1 + r));  // cached rows: computed at 1 + r, act at P + r
      REQUIRE(by_r[r].add(want, eval_all(fwd, tower, cont), V));
    }
  }
  MESSAGE("exact mode, Q8 segment (for scale): mean KL " << exact_q8.kl() << " nats, top-1 " << 100 * exact_q8.top1()
                                                         << "%");
  for (int32_t r : repairs) {
    MESSAGE("modular r=" << r << ": mean KL " << by_r[r].kl() << " nats, top-1 agreement " << 100 * by_r[r].top1()
                         << "% (" << by_r[r].count << " positions)");
  }
  // Repair never makes it worse on average.
  CHECK(by_r[4].kl() <= by_r[0].kl());
  CHECK(by_r[16].kl() <= by_r[0].kl());
  CHECK(by_r[16].top1() >= by_r[0].top1());
}

// The daemon's case (issue 16): a bot computed under its platform, whose platform text is then edited:
// 30 tokens inserted 20 tokens before its end ("insert"), or its last 20 tokens replaced by 30 others
// ("rewrite end", the hardest place: right before the bot). The bot's cached rows are placed under the
// new platform with a RoPE shift and their first r tokens repaired, against recomputing the bot there.
// The setup is bench/modular_quality.h's, which `bench_towers --edit-drift` reports from as well.
TEST_CASE("edited parent: a child reused under its edited parent, r = 0 8 16 32 against recomputation") {
  const std::vector<int32_t> repairs = {0, 8, 16, 32};
  const modular_quality::EditShape shape;  // parent 100 (with BOS), 30 inserted 20 before its end, child 60, 80 after
  for (const std::string file : {"models/stories260K.gguf", "models/babyllama105.gguf"}) {
    CAPTURE(file);
    auto model = load_shared(file.c_str());
    if (!model) return;
    auto ps = passages(*model, 9, shape.passage());
    if (ps.size() < 2) return;
    ThreadPool pool(2);
    Forward fwd(*model, pool, Kernels::Reference);
    const ModelConfig& cfg = model->config();
    const int V = cfg.n_vocab;
    for (const auto edit : {modular_quality::Edit::Insert, modular_quality::Edit::RewriteEnd}) {
      const std::string edit_name = modular_quality::edit_name(edit);
      CAPTURE(edit_name);
      std::map<int32_t, Agreement> by_r;
      for (size_t k = 0; k + 1 < ps.size(); ++k) {
        auto edited = modular_quality::edited_parent(fwd, cfg, ps[k], ps[k + 1], edit, shape);
        REQUIRE_MESSAGE(edited.ok(), edited.error());
        const modular_quality::EditedParent& c = edited.value();
        for (int32_t r : repairs) {
          auto t = modular_quality::place_child(fwd, cfg, c, r);
          REQUIRE(t.ok());
          std::vector<KvSpan> spans;
          t.value()->spans(0, 0, spans);
          CHECK(spans.back().rope_delta == c.shift);  // the cached rows act where the new parent ends
          REQUIRE(by_r[r].add(c.want, eval_all(fwd, *t.value(), c.continuation), V));
        }
        // Repairing all of it is recomputation.
        auto t_full = modular_quality::place_child(fwd, cfg, c, shape.child);
        REQUIRE(t_full.ok());
        CHECK(max_abs_diff(eval_all(fwd, *t_full.value(), c.continuation), c.want) < 1e-4);
      }
      for (int32_t r : repairs) {
        MESSAGE(file << " " << edit_name << " r=" << r << ": mean KL " << by_r[r].kl()
                     << " nats, top-1 agreement " << 100 * by_r[r].top1() << "% (" << by_r[r].count << " positions)");
      }
      CHECK(by_r[32].kl() <= by_r[0].kl());
      CHECK(by_r[32].top1() >= by_r[0].top1());
    }
  }
}
