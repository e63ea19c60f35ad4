// Segments and towers.
// A segment is a run of tokens with the keys and values every layer computed for them, at the
// position they were computed at, under a parent chain of segments. It is stored once, in one format
// (F32, F16, Q8, Q6, Q4), and shared read-only by every tower that includes it.
// A tower is one session's context: an ordered list of segments plus the session's own growing tail.
// Attention walks it in place (see KvSpan): shared keys and values are never copied per session.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/rope.h"

namespace towers {

using SegmentId = uint64_t;

// Which format a segment gets from its depth in the hierarchy (0 = platform base, 1 = community,
// 2 = bot, ...). Deeper means more shared and less attended per token: fewer bits (seed Theorem 19).
struct DepthPolicy {
  std::vector<KvQuant> by_depth = {KvQuant::Q4, KvQuant::Q6, KvQuant::Q8};
  KvQuant transcript = KvQuant::Q8;  // sealed parts of a session's own transcript (Q8: docs/towers.md)
  KvQuant at_depth(size_t depth) const {
    return depth < by_depth.size() ? by_depth[depth] : (by_depth.empty() ? KvQuant::F16 : by_depth.back());
  }
};

// Bytes of one token's keys and values over every layer in `format` (a segment's KV per token, and
// a lease tail's in F32; per-channel key scales, fixed per segment, not counted).
size_t kv_bytes_per_token(const ModelConfig& config, KvQuant format);

class Segment {
 public:
  // Takes rows [row0, row0 + tokens.size()) of a dense cache (all layers) into a new segment.
  static std::shared_ptr<const Segment> from_cache(const ModelConfig& config, const DenseKvCache& cache,
                                                   int32_t row0, std::vector<int32_t> tokens, KvQuant format,
                                                   SegmentId id, SegmentId parent);
  // The same from a whole tail that is not used again (Tower::seal_tail): each layer's rows go back
  // to the system as soon as they are quantized, and the new segment's pages are touched only as
  // they are written, so a long tail and its segment are never both whole in RAM.
  static std::shared_ptr<const Segment> from_tail(const ModelConfig& config, DenseKvCache&& tail,
                                                  std::vector<int32_t> tokens, KvQuant format, SegmentId id,
                                                  SegmentId parent);

  SegmentId id() const { return id_; }
  SegmentId parent() const { return parent_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int32_t length() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t computed_pos() const { return computed_pos_; }  // position of its first token when computed
  KvQuant format() const { return format_; }
  size_t kv_bytes() const { return k_.size() + v_.size() + k_scale_.size_bytes(); }

  // The span of one layer with the rows acting at positions [at, at + length()).
  KvSpan span(int layer, int32_t at) const;
  // The rotate-K path of the RoPE shift: a copy whose keys are re-rotated to be computed at new_pos
  // (dequantize, rotate, quantize again). The zero-copy alternative is placing the segment at another
  // position in a tower, which counter-rotates the query instead.
  std::shared_ptr<const Segment> shifted(int32_t new_pos, const Rope& rope, SegmentId new_id) const;
  // The same, under another parent (a session's kept turns moved up after older turns were dropped).
  std::shared_ptr<const Segment> shifted(int32_t new_pos, const Rope& rope, SegmentId new_id, SegmentId new_parent) const;
  // Rows [from, to) of several segments, one after another from position `pos`, as one segment in
  // `format`: each piece's keys are re-rotated to where its rows land (the RoPE shift). Modular
  // placement joins the rows it recomputed in the new context with the reused rest of the old segment.
  struct Rows {
    const Segment* segment = nullptr;
    int32_t from = 0, to = 0;
  };
  static std::shared_ptr<const Segment> join(std::span<const Rows> pieces, int32_t pos, const Rope& rope, KvQuant format,
                                             SegmentId id, SegmentId parent);
  // Dequantized key row (kv_dim floats) of one layer, with channel scales applied (tests, tools).
  std::vector<float> key_row(int layer, int32_t row) const;

  // The stored form, for segment files (mmapstore/segment_file.h).
  struct Parts {
    SegmentId id = 0, parent = 0;
    std::vector<int32_t> tokens;
    int32_t computed_pos = 0;
    KvQuant format = KvQuant::F32;
    std::vector<uint8_t> k, v;    // [layer][row][kv head] vectors in `format`
    std::vector<float> k_scale;   // [layer][kv_dim] for quantized formats, else empty
  };
  // The same, with the K/V bytes held by someone else (a mapped segment file): the segment reads them
  // in place, never copies them, and keeps `owner` alive as long as it lives.
  struct View {
    SegmentId id = 0, parent = 0;
    std::vector<int32_t> tokens;
    int32_t computed_pos = 0;
    KvQuant format = KvQuant::F32;
    std::span<const uint8_t> k, v;
    std::span<const float> k_scale;
  };
  int n_layer() const { return n_layer_; }
  int n_head_kv() const { return n_head_kv_; }
  int head_dim() const { return head_dim_; }
  std::span<const uint8_t> k_bytes() const { return k_; }
  std::span<const uint8_t> v_bytes() const { return v_; }
  std::span<const float> k_scales() const { return k_scale_; }
  // Rebuilds a segment; an error when the sizes do not fit the format and the model's shape.
  static Result<std::shared_ptr<const Segment>> from_parts(const ModelConfig& config, Parts parts);
  static Result<std::shared_ptr<const Segment>> from_view(const ModelConfig& config, View view,
                                                          std::shared_ptr<const void> owner);

 private:
  Segment() = default;
  SegmentId id_ = 0, parent_ = 0;
  std::vector<int32_t> tokens_;
  int32_t computed_pos_ = 0;
  KvQuant format_ = KvQuant::F32;
  int n_layer_ = 0, n_head_kv_ = 0, head_dim_ = 0;
  size_t head_bytes_ = 0, row_bytes_ = 0;
  std::shared_ptr<const void> owner_;  // holds the bytes below: an owned buffer or a file mapping
  std::span<const uint8_t> k_, v_;     // [layer][row][kv head] vectors of head_bytes_
  std::span<const float> k_scale_;     // [layer][kv head][head_dim], quantized formats only

  // from_cache and from_tail: `release`, the cache whose layers go back once read (from_tail).
  static std::shared_ptr<const Segment> from_rows(const ModelConfig& c, const DenseKvCache& cache, int32_t row0,
                                                  std::vector<int32_t> tokens, KvQuant format, SegmentId id,
                                                  SegmentId parent, DenseKvCache* release);
  // fill(l, k, v) writes layer l's rows as [row][kv_dim] floats: one layer at a time, so sealing a long
  // tail needs two layers of f32, not the whole segment twice.
  using LayerRows = std::function<void(int layer, float* k, float* v)>;
  void quantize_rows(const ModelConfig& c, const LayerRows& fill);
  // Checks sizes against the format and shape, then points the segment at the bytes.
  static Result<std::shared_ptr<Segment>> assemble(const ModelConfig& c, SegmentId id, SegmentId parent,
                                                   std::vector<int32_t> tokens, int32_t computed_pos, KvQuant format,
                                                   std::span<const uint8_t> k, std::span<const uint8_t> v,
                                                   std::span<const float> k_scale, std::shared_ptr<const void> owner);
};

// One session's context: shared segments (root first) followed by its own tail (F32, or F16: kv_cache.h).
class Tower final : public KvCache {
 public:
  // Segments are placed one after another from position 0. A segment placed where it was not computed
  // (its parent chain differs: "modular" reuse) gets a RoPE shift; exact reuse has none.
  Tower(const ModelConfig& config, std::vector<std::shared_ptr<const Segment>> segments, int32_t tail_capacity,
        KvQuant tail_format = KvQuant::F32);

  int32_t size() const override { return base_len_ + tail_.size(); }
  int32_t next_pos() const override { return tail_.next_pos(); }
  int32_t capacity() const override { return base_len_ + tail_.capacity(); }
  void put_pending(int layer, int32_t i, const float* k, const float* v) override { tail_.put_pending(layer, i, k, v); }
  void spans(int layer, int32_t n_pending, std::vector<KvSpan>& out) const override;
  void commit(int32_t n) override { tail_.commit(n); }
  // Only the tail can be cut: n is clamped to at least the segments' length.
  void truncate(int32_t n) override { tail_.truncate(n > base_len_ ? n - base_len_ : 0); }

  const std::vector<std::shared_ptr<const Segment>>& segments() const { return segments_; }
  int32_t base_length() const { return base_len_; }
  int32_t tail_length() const { return tail_.size(); }
  size_t tail_bytes() const { return tail_.bytes(); }
  KvQuant tail_format() const { return tail_.format(); }
  // Seals the tail's rows into a new segment (tokens must be the tail's tokens) and starts an empty
  // tail after it; the tower keeps attending to the sealed rows through the new segment.
  // nullptr when the tail is empty or tokens.size() differs from its length.
  std::shared_ptr<const Segment> seal_tail(std::vector<int32_t> tokens, KvQuant format, SegmentId id);

 private:
  const ModelConfig& config_;
  std::vector<std::shared_ptr<const Segment>> segments_;
  std::vector<int32_t> placed_at_;  // position each segment acts at
  int32_t base_len_ = 0;
  DenseKvCache tail_;
};

}  // namespace towers
