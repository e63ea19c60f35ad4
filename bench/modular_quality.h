// Quality of modular placement (engine/model/modular.h) against exact prefill, shared by tests/test_modular.cc
// (which asserts on it) and `bench_towers --edit-drift` (which reports it): the KL / top-1 accumulator,
// exact segments, and issue 16's case, a child segment computed under its parent, the parent's text
// then edited, the child reused under the new parent (ModularSegment::reuse + place_modular, first r
// tokens repaired) against recomputing it there.
//
// It lives in bench/ because it is measurement code with no test framework in it: every header in
// tests/ includes doctest, which bench_towers does not link.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/model/forward.h"
#include "engine/model/modular.h"
#include "engine/model/segment.h"

namespace towers::modular_quality {

// Mean KL(want || got) in nats and top-1 agreement over rows of V logits each.
struct Agreement {
  double kl_sum = 0, agree = 0;
  int count = 0;
  // False (nothing added) when want and got differ in size.
  [[nodiscard]] bool add(const std::vector<float>& want, const std::vector<float>& got, int V) {
    if (want.size() != got.size()) return false;
    for (size_t r = 0; r < want.size() / V; ++r) {
      const float* a = &want[r * V];
      const float* b = &got[r * V];
      const double ma = *std::max_element(a, a + V), mb = *std::max_element(b, b + V);
      double za = 0, zb = 0;
      for (int i = 0; i < V; ++i) za += std::exp(a[i] - ma), zb += std::exp(b[i] - mb);
      double kl = 0;
      for (int i = 0; i < V; ++i) {
        const double lp = a[i] - ma - std::log(za), lq = b[i] - mb - std::log(zb);
        kl += std::exp(lp) * (lp - lq);
      }
      kl_sum += std::max(kl, 0.0);
      agree += (std::max_element(a, a + V) - a) == (std::max_element(b, b + V) - b);
      ++count;
    }
    return true;
  }
  double kl() const { return count ? kl_sum / count : 0.0; }
  double top1() const { return count ? agree / count : 0.0; }
};

// Prefills `tokens` after `prefix` and seals them into one exact segment (the pool's exact mode).
inline Result<std::shared_ptr<const Segment>> exact_segment(Forward& fwd, const ModelConfig& cfg,
                                                            const std::vector<std::shared_ptr<const Segment>>& prefix,
                                                            std::span<const int32_t> tokens, KvQuant format,
                                                            SegmentId id) {
  Tower t(cfg, prefix, static_cast<int32_t>(tokens.size()));
  std::vector<float> logits;
  if (auto st = fwd.eval(t, tokens, Logits::Last, logits); !st.ok()) return st;
  auto s = t.seal_tail({tokens.begin(), tokens.end()}, format, id);
  if (!s) return Status::Error("seal_tail failed");
  return s;
}

// How the parent is edited: `inserted` tokens put `back` tokens before its end (Insert), or its last
// `back` tokens replaced by `inserted` others (RewriteEnd: the text right before the child changes, the
// harder case).
enum class Edit { Insert, RewriteEnd };
inline const char* edit_name(Edit e) { return e == Edit::Insert ? "insert" : "rewrite end"; }

// Token counts: old parent (with BOS), inserted, where (before the parent's end), child, continuation;
// a passage needs parent + child + continuation tokens.
struct EditShape {
  int parent = 100, inserted = 30, back = 20, child = 60, continuation = 80;
  int passage() const { return parent + child + continuation; }
};

// The new parent computed, the child as computed under the old one, and what recomputation predicts.
struct EditedParent {
  std::vector<int32_t> new_parent;
  std::span<const int32_t> child, continuation;  // views into the passage `ids`
  int32_t shift = 0;                             // new parent length - old parent length
  std::vector<float> want;                       // continuation logits, new parent + child prefilled as one
  std::shared_ptr<const Segment> new_parent_segment;
  std::shared_ptr<const ModularSegment> reused;  // the child as computed under the old parent
};

// One case from a passage `ids` (parent, child and continuation cut from it in that order) and another
// passage `other` (the inserted tokens: its first ones after BOS). F32 segments: only placement errs.
inline Result<EditedParent> edited_parent(Forward& fwd, const ModelConfig& cfg, const std::vector<int32_t>& ids,
                                          const std::vector<int32_t>& other, Edit edit, const EditShape& s) {
  if (static_cast<int>(ids.size()) < s.passage() || static_cast<int>(other.size()) < 1 + s.inserted ||
      s.back > s.parent - 1) {
    return Status::InvalidArgument("passage too short for the edited-parent shape");
  }
  EditedParent c;
  std::vector<int32_t> old_parent(ids.begin(), ids.begin() + s.parent);
  c.new_parent.assign(ids.begin(), ids.begin() + s.parent - s.back);
  c.new_parent.insert(c.new_parent.end(), other.begin() + 1, other.begin() + 1 + s.inserted);
  if (edit == Edit::Insert) {
    c.new_parent.insert(c.new_parent.end(), ids.begin() + s.parent - s.back, ids.begin() + s.parent);
  }
  c.shift = static_cast<int32_t>(c.new_parent.size()) - s.parent;
  c.child = std::span<const int32_t>(ids.data() + s.parent, s.child);
  c.continuation = std::span<const int32_t>(ids.data() + s.parent + s.child, s.continuation);

  std::vector<int32_t> mono_ids = c.new_parent;
  mono_ids.insert(mono_ids.end(), c.child.begin(), c.child.end());
  mono_ids.insert(mono_ids.end(), c.continuation.begin(), c.continuation.end());
  DenseKvCache mono(cfg, static_cast<int32_t>(mono_ids.size()));
  std::vector<float> ref;
  if (auto st = fwd.eval(mono, mono_ids, Logits::All, ref); !st.ok()) return st;
  c.want.assign(ref.begin() + static_cast<std::ptrdiff_t>((c.new_parent.size() + s.child) * cfg.n_vocab), ref.end());

  auto old_seg = exact_segment(fwd, cfg, {}, old_parent, KvQuant::F32, 1);
  if (!old_seg.ok()) return old_seg.status();
  auto old_child = exact_segment(fwd, cfg, {old_seg.value()}, c.child, KvQuant::F32, 2);
  if (!old_child.ok()) return old_child.status();
  auto new_seg = exact_segment(fwd, cfg, {}, c.new_parent, KvQuant::F32, 3);
  if (!new_seg.ok()) return new_seg.status();
  c.new_parent_segment = new_seg.value();
  c.reused = ModularSegment::reuse(old_child.value());
  return c;
}

// The child placed under the new parent with its first `repair` tokens prefilled again, room for the
// continuation after it.
inline Result<std::unique_ptr<Tower>> place_child(Forward& fwd, const ModelConfig& cfg, const EditedParent& c,
                                                  int32_t repair) {
  ModularPlacement pl;
  pl.repair = repair;
  pl.tail_capacity = static_cast<int32_t>(c.continuation.size());
  return place_modular(fwd, cfg, {c.new_parent_segment}, *c.reused, pl);
}

}  // namespace towers::modular_quality
