#include "engine/model/modular.h"

#include <algorithm>
#include <cstring>

namespace towers {

std::shared_ptr<const Segment> slice_segment(const Segment& seg, int32_t from, int32_t to, SegmentId new_id) {
  if (from < 0 || to > seg.length() || from >= to) return nullptr;
  const int32_t n = seg.length(), m = to - from;
  const size_t row_bytes = simd::kv_vec_bytes(seg.format(), seg.head_dim()) * seg.n_head_kv();
  Segment::Parts p;
  p.id = new_id;
  p.parent = seg.parent();
  p.tokens.assign(seg.tokens().begin() + from, seg.tokens().begin() + to);
  p.computed_pos = seg.computed_pos() + from;
  p.format = seg.format();
  p.k.resize(size_t(seg.n_layer()) * m * row_bytes);
  p.v.resize(p.k.size());
  for (int l = 0; l < seg.n_layer(); ++l) {
    const size_t src = (size_t(l) * n + from) * row_bytes, dst = size_t(l) * m * row_bytes;
    std::memcpy(&p.k[dst], seg.k_bytes().data() + src, size_t(m) * row_bytes);
    std::memcpy(&p.v[dst], seg.v_bytes().data() + src, size_t(m) * row_bytes);
  }
  p.k_scale.assign(seg.k_scales().begin(), seg.k_scales().end());  // per layer and channel, over the whole segment: the codes refer to them
  ModelConfig c;
  c.n_layer = seg.n_layer();
  c.n_head_kv = seg.n_head_kv();
  c.head_dim = seg.head_dim();
  auto s = Segment::from_parts(c, std::move(p));
  return s.ok() ? s.value() : nullptr;
}

Result<std::shared_ptr<const ModularSegment>> ModularSegment::compute(Forward& forward, const ModelConfig& config,
                                                                      int32_t bos, std::vector<int32_t> tokens,
                                                                      KvQuant format, SegmentId id) {
  if (tokens.empty()) return Status::Error("modular segment has no tokens");
  std::vector<int32_t> ids;
  ids.reserve(tokens.size() + 1);
  ids.push_back(bos);
  ids.insert(ids.end(), tokens.begin(), tokens.end());
  DenseKvCache cache(config, static_cast<int32_t>(ids.size()));
  std::vector<float> logits;
  if (Status st = forward.eval(cache, ids, Logits::Last, logits); !st.ok()) return st;
  auto seg = Segment::from_cache(config, cache, 1, std::move(tokens), format, id, 0);
  return std::shared_ptr<const ModularSegment>(new ModularSegment(std::move(seg)));
}

std::shared_ptr<const ModularSegment> ModularSegment::reuse(std::shared_ptr<const Segment> segment) {
  return std::shared_ptr<const ModularSegment>(new ModularSegment(std::move(segment)));
}

std::shared_ptr<const Segment> ModularSegment::rest(int32_t r) const {
  if (r <= 0) return segment_;
  if (r >= length()) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = rest_[r];
  if (!slot) slot = slice_segment(*segment_, r, length(), segment_->id());
  return slot;
}

Result<std::unique_ptr<Tower>> place_modular(Forward& forward, const ModelConfig& config,
                                             std::vector<std::shared_ptr<const Segment>> prefix,
                                             const ModularSegment& modular, const ModularPlacement& placement) {
  const int32_t n = modular.length();
  const int32_t r = std::clamp(placement.repair, 0, n);
  std::vector<std::shared_ptr<const Segment>> segs = std::move(prefix);
  if (r > 0) {
    Tower fresh(config, segs, r);
    const std::vector<int32_t>& toks = modular.segment()->tokens();
    std::span<const int32_t> head(toks.data(), static_cast<size_t>(r));
    std::vector<float> logits;
    if (Status st = forward.eval(fresh, head, Logits::Last, logits); !st.ok()) return st;
    auto repaired = fresh.seal_tail({head.begin(), head.end()},
                                    placement.repair_format.value_or(modular.segment()->format()),
                                    placement.repair_id);
    if (!repaired) return Status::Error("modular placement: sealing the repaired rows failed");
    segs = fresh.segments();
  }
  if (r < n) segs.push_back(modular.rest(r));
  return std::make_unique<Tower>(config, std::move(segs), placement.tail_capacity);
}

}  // namespace towers
