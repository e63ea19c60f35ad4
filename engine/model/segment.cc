#include "engine/model/segment.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace towers {

namespace {
bool uses_channel_scales(KvQuant f) { return f == KvQuant::Q8 || f == KvQuant::Q6 || f == KvQuant::Q4; }

// The bytes of a segment that owns them, rebuilt from Parts.
struct OwnedKv {
  std::vector<uint8_t> k, v;
  std::vector<float> k_scale;
};
// ... or quantized here: not zeroed (every byte is written), so a page costs RAM only once written.
struct QuantizedKv {
  std::unique_ptr<uint8_t[]> k, v;
  std::vector<float> k_scale;
};
}  // namespace

std::shared_ptr<const Segment> Segment::from_cache(const ModelConfig& c, const DenseKvCache& cache,
                                                   int32_t row0, std::vector<int32_t> tokens,
                                                   KvQuant format, SegmentId id, SegmentId parent) {
  return from_rows(c, cache, row0, std::move(tokens), format, id, parent, nullptr);
}

std::shared_ptr<const Segment> Segment::from_tail(const ModelConfig& c, DenseKvCache&& tail, std::vector<int32_t> tokens,
                                                  KvQuant format, SegmentId id, SegmentId parent) {
  return from_rows(c, tail, 0, std::move(tokens), format, id, parent, &tail);
}

std::shared_ptr<const Segment> Segment::from_rows(const ModelConfig& c, const DenseKvCache& cache, int32_t row0,
                                                  std::vector<int32_t> tokens, KvQuant format, SegmentId id,
                                                  SegmentId parent, DenseKvCache* release) {
  std::shared_ptr<Segment> s(new Segment());
  s->id_ = id;
  s->parent_ = parent;
  s->tokens_ = std::move(tokens);
  s->computed_pos_ = cache.first_pos() + row0;
  s->format_ = format;
  const int32_t n = s->length(), kvd = c.kv_dim();
  s->quantize_rows(c, [&](int l, float* k, float* v) {
    for (int32_t r = 0; r < n; ++r) cache.row_f32(l, row0 + r, k + size_t(r) * kvd, v + size_t(r) * kvd);
    if (release) release->release_layer(l);
  });
  return s;
}

// For quantized formats every key channel is first divided by its largest magnitude over the segment
// (per layer and head), so a few outlier channels do not eat the code range of all the others;
// attention multiplies the query by the same scales.
void Segment::quantize_rows(const ModelConfig& c, const LayerRows& fill) {
  n_layer_ = c.n_layer;
  n_head_kv_ = c.n_head_kv;
  head_dim_ = c.head_dim;
  head_bytes_ = simd::kv_vec_bytes(format_, head_dim_);
  row_bytes_ = head_bytes_ * n_head_kv_;
  const int32_t n = length();
  const int kvd = c.kv_dim(), hd = head_dim_;
  auto own = std::make_shared<QuantizedKv>();
  const size_t bytes = size_t(n_layer_) * n * row_bytes_;
  own->k.reset(new uint8_t[bytes]);
  own->v.reset(new uint8_t[bytes]);
  if (uses_channel_scales(format_)) own->k_scale.assign(size_t(n_layer_) * kvd, 1.0f);
  std::vector<float> tmp(hd);
  std::vector<float> k(size_t(n) * kvd), v(k.size());  // one layer's rows
  for (int l = 0; l < n_layer_; ++l) {
    fill(l, k.data(), v.data());
    float* scale = own->k_scale.empty() ? nullptr : &own->k_scale[size_t(l) * kvd];
    if (scale) {
      for (int e = 0; e < kvd; ++e) {
        float mx = 0;
        for (int32_t r = 0; r < n; ++r) mx = std::max(mx, std::abs(k[size_t(r) * kvd + e]));
        scale[e] = mx > 0 ? mx : 1.0f;
      }
    }
    for (int32_t r = 0; r < n; ++r) {
      const float* kr = &k[size_t(r) * kvd];
      const float* vr = &v[size_t(r) * kvd];
      for (int h = 0; h < n_head_kv_; ++h) {
        const size_t at = (size_t(l) * n + r) * row_bytes_ + size_t(h) * head_bytes_;  // (the output: all layers)
        for (int e = 0; e < hd; ++e) tmp[e] = scale ? kr[h * hd + e] / scale[h * hd + e] : kr[h * hd + e];
        simd::kv_quantize(format_, tmp.data(), &own->k[at], hd);
        simd::kv_quantize(format_, vr + h * hd, &own->v[at], hd);
      }
    }
  }
  k_ = std::span<const uint8_t>(own->k.get(), bytes);
  v_ = std::span<const uint8_t>(own->v.get(), bytes);
  k_scale_ = own->k_scale;
  owner_ = std::move(own);
}

size_t kv_bytes_per_token(const ModelConfig& c, KvQuant format) {
  return 2 * static_cast<size_t>(c.n_layer) * static_cast<size_t>(c.n_head_kv) * simd::kv_vec_bytes(format, c.head_dim);
}

Result<std::shared_ptr<Segment>> Segment::assemble(const ModelConfig& c, SegmentId id, SegmentId parent,
                                                   std::vector<int32_t> tokens, int32_t computed_pos, KvQuant format,
                                                   std::span<const uint8_t> k, std::span<const uint8_t> v,
                                                   std::span<const float> k_scale, std::shared_ptr<const void> owner) {
  if (!simd::kv_quant_ok(format, c.head_dim)) return Status::InvalidArgument("segment format does not fit the model's head size");
  if (tokens.empty()) return Status::InvalidArgument("segment has no tokens");
  if (computed_pos < 0) return Status::InvalidArgument("segment has a negative position");
  const size_t row_bytes = simd::kv_vec_bytes(format, c.head_dim) * c.n_head_kv;
  const size_t want = size_t(c.n_layer) * tokens.size() * row_bytes;
  if (k.size() != want || v.size() != want) {
    return Status::InvalidArgument("segment holds " + std::to_string(k.size()) + " key bytes, its shape needs " +
                                   std::to_string(want));
  }
  const size_t scales = uses_channel_scales(format) ? size_t(c.n_layer) * c.kv_dim() : 0;
  if (k_scale.size() != scales) return Status::InvalidArgument("segment key scales do not fit its format and shape");
  std::shared_ptr<Segment> s(new Segment());
  s->id_ = id;
  s->parent_ = parent;
  s->tokens_ = std::move(tokens);
  s->computed_pos_ = computed_pos;
  s->format_ = format;
  s->n_layer_ = c.n_layer;
  s->n_head_kv_ = c.n_head_kv;
  s->head_dim_ = c.head_dim;
  s->head_bytes_ = simd::kv_vec_bytes(format, c.head_dim);
  s->row_bytes_ = row_bytes;
  s->k_ = k;
  s->v_ = v;
  s->k_scale_ = k_scale;
  s->owner_ = std::move(owner);
  return s;
}

Result<std::shared_ptr<const Segment>> Segment::from_parts(const ModelConfig& c, Parts p) {
  auto own = std::make_shared<OwnedKv>(OwnedKv{std::move(p.k), std::move(p.v), std::move(p.k_scale)});
  auto s = assemble(c, p.id, p.parent, std::move(p.tokens), p.computed_pos, p.format, own->k, own->v, own->k_scale, own);
  if (!s.ok()) return s.status();
  return std::shared_ptr<const Segment>(std::move(s.value()));
}

Result<std::shared_ptr<const Segment>> Segment::from_view(const ModelConfig& c, View w, std::shared_ptr<const void> owner) {
  auto s = assemble(c, w.id, w.parent, std::move(w.tokens), w.computed_pos, w.format, w.k, w.v, w.k_scale, std::move(owner));
  if (!s.ok()) return s.status();
  return std::shared_ptr<const Segment>(std::move(s.value()));
}

KvSpan Segment::span(int layer, int32_t at) const {
  KvSpan s;
  s.pos0 = at;
  s.n = length();
  s.rope_delta = at - computed_pos_;
  s.format = format_;
  const size_t layer_bytes = size_t(length()) * row_bytes_;
  s.k = k_.data() + size_t(layer) * layer_bytes;
  s.v = v_.data() + size_t(layer) * layer_bytes;
  s.row_bytes = row_bytes_;
  s.head_bytes = head_bytes_;
  s.k_scale = k_scale_.empty() ? nullptr : k_scale_.data() + size_t(layer) * n_head_kv_ * head_dim_;
  return s;
}

std::vector<float> Segment::key_row(int layer, int32_t row) const {
  const int kvd = n_head_kv_ * head_dim_;
  std::vector<float> out(kvd);
  const uint8_t* base = k_.data() + (size_t(layer) * length() + row) * row_bytes_;
  for (int h = 0; h < n_head_kv_; ++h) {
    simd::kv_dequantize(format_, base + size_t(h) * head_bytes_, &out[size_t(h) * head_dim_], head_dim_);
  }
  if (!k_scale_.empty()) {
    for (int e = 0; e < kvd; ++e) out[e] *= k_scale_[size_t(layer) * kvd + e];
  }
  return out;
}

std::shared_ptr<const Segment> Segment::shifted(int32_t new_pos, const Rope& rope, SegmentId new_id) const {
  return shifted(new_pos, rope, new_id, parent_);
}

std::shared_ptr<const Segment> Segment::shifted(int32_t new_pos, const Rope& rope, SegmentId new_id,
                                                SegmentId new_parent) const {
  const Rows all{this, 0, length()};
  return join(std::span(&all, 1), new_pos, rope, format_, new_id, new_parent);
}

std::shared_ptr<const Segment> Segment::join(std::span<const Rows> pieces, int32_t pos, const Rope& rope, KvQuant format,
                                             SegmentId id, SegmentId parent) {
  if (pieces.empty() || !pieces[0].segment) return nullptr;
  const Segment& first = *pieces[0].segment;
  std::shared_ptr<Segment> s(new Segment());
  s->id_ = id;
  s->parent_ = parent;
  s->computed_pos_ = pos;
  s->format_ = format;
  for (const Rows& p : pieces) {
    if (!p.segment || p.from < 0 || p.to > p.segment->length() || p.from >= p.to || p.segment->n_layer_ != first.n_layer_ ||
        p.segment->n_head_kv_ != first.n_head_kv_ || p.segment->head_dim_ != first.head_dim_) {
      return nullptr;
    }
    s->tokens_.insert(s->tokens_.end(), p.segment->tokens_.begin() + p.from, p.segment->tokens_.begin() + p.to);
  }
  const int32_t n = s->length();
  const int n_layer = first.n_layer_, n_head_kv = first.n_head_kv_, head_dim = first.head_dim_;
  const int kvd = n_head_kv * head_dim;
  ModelConfig c;
  c.n_layer = n_layer;
  c.n_head_kv = n_head_kv;
  c.head_dim = head_dim;
  s->quantize_rows(c, [&](int l, float* k, float* v) {
    int32_t out = 0;  // row of the joined segment
    for (const Rows& p : pieces) {
      const Segment& src = *p.segment;
      // Where the piece's first row lands, minus where it was computed.
      const float delta = static_cast<float>(pos + out - (src.computed_pos_ + p.from));
      for (int32_t r = p.from; r < p.to; ++r, ++out) {
        std::vector<float> kr = src.key_row(l, r);
        if (delta != 0) rope.rotate(kr.data(), n_head_kv, delta, l);
        std::copy(kr.begin(), kr.end(), &k[size_t(out) * kvd]);
        const uint8_t* vb = src.v_.data() + (size_t(l) * src.length() + r) * src.row_bytes_;
        for (int h = 0; h < n_head_kv; ++h) {
          simd::kv_dequantize(src.format_, vb + size_t(h) * src.head_bytes_, &v[size_t(out) * kvd + h * head_dim], head_dim);
        }
      }
    }
  });
  return s;
}

Tower::Tower(const ModelConfig& config, std::vector<std::shared_ptr<const Segment>> segments,
             int32_t tail_capacity, KvQuant tail_format)
    : config_(config),
      segments_(std::move(segments)),
      base_len_(0),
      tail_(config, 0) {
  for (const auto& s : segments_) {
    placed_at_.push_back(base_len_);
    base_len_ += s->length();
  }
  tail_ = DenseKvCache(config, tail_capacity, base_len_, tail_format);
}

void Tower::spans(int layer, int32_t n_pending, std::vector<KvSpan>& out) const {
  out.clear();
  for (size_t i = 0; i < segments_.size(); ++i) out.push_back(segments_[i]->span(layer, placed_at_[i]));
  tail_.append_spans(layer, n_pending, out);
}

std::shared_ptr<const Segment> Tower::seal_tail(std::vector<int32_t> tokens, KvQuant format, SegmentId id) {
  if (tokens.size() != static_cast<size_t>(tail_.size()) || tokens.empty()) return nullptr;
  const SegmentId parent = segments_.empty() ? 0 : segments_.back()->id();
  const int32_t capacity_left = tail_.capacity() - tail_.size();
  const KvQuant tail_format = tail_.format();
  auto seg = Segment::from_tail(config_, std::move(tail_), std::move(tokens), format, id, parent);
  placed_at_.push_back(base_len_);
  base_len_ += seg->length();
  segments_.push_back(seg);
  tail_ = DenseKvCache(config_, capacity_left, base_len_, tail_format);
  return seg;
}

}  // namespace towers
