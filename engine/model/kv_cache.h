// How the forward pass stores and reads keys and values.
// Attention sees a layer's cache as an ordered list of spans: runs of rows stored contiguously in one
// format, each row holding K (rotated for the position it was computed at) and V for every KV head.
// A per-session dense cache is one span per layer; a tower of shared segments is one span per segment,
// read in place: a span may be quantized, and may have been computed at another position (RoPE shift).
#pragma once
#include <cstdint>
#include <vector>

#include "engine/model/model.h"
#include "engine/base/status.h"
#include "simd/kv_quant.h"

namespace towers {

using simd::KvQuant;

struct KvSpan {
  int32_t pos0 = 0;        // row i acts as position pos0 + i (causal mask, relative distances)
  int32_t n = 0;           // rows
  int32_t rope_delta = 0;  // pos0 minus the position row 0 was computed at; attention counter-rotates
                           // the query by this much instead of touching K
  KvQuant format = KvQuant::F32;
  const uint8_t* k = nullptr;
  const uint8_t* v = nullptr;
  size_t row_bytes = 0;    // from one row to the next (all KV heads)
  size_t head_bytes = 0;   // one head's vector within a row
  // Per-channel key scales [n_head_kv][head_dim] that were divided out of K before quantizing
  // (tames outlier channels); attention multiplies the query by them instead. nullptr: none.
  const float* k_scale = nullptr;
};

class KvCache {
 public:
  virtual ~KvCache() = default;
  // Rows committed so far.
  virtual int32_t size() const = 0;
  // Position of the next token.
  virtual int32_t next_pos() const = 0;
  // Most rows this cache can hold.
  virtual int32_t capacity() const = 0;
  // Stores pending row i (< n_pending) of `layer` (kv_dim floats of K and of V), before attention
  // reads it and before commit(). A cache may keep it in a narrower format: then attention reads the
  // stored rows, pending ones included, so a row's result never depends on how tokens were split
  // into steps.
  virtual void put_pending(int layer, int32_t i, const float* k, const float* v) = 0;
  // Spans of `layer` covering committed rows plus the first n_pending pending rows, in position order.
  virtual void spans(int layer, int32_t n_pending, std::vector<KvSpan>& out) const = 0;
  virtual void commit(int32_t n) = 0;
  // Forgets rows from n on (n <= size()).
  virtual void truncate(int32_t n) = 0;
};

// Rows for positions [first_pos, first_pos + capacity): one session's private cache, or the growing
// tail of a tower. Stored in F32, or F16 (half the bytes: a lease tail of an 8B model holding a long
// prompt; `[model] tail_format`), every row rounded as it is stored (put_pending).
class DenseKvCache final : public KvCache {
 public:
  DenseKvCache(const ModelConfig& config, int32_t capacity, int32_t first_pos = 0, KvQuant format = KvQuant::F32);
  int32_t size() const override { return size_; }
  int32_t next_pos() const override { return first_pos_ + size_; }
  int32_t capacity() const override { return capacity_; }
  void put_pending(int layer, int32_t i, const float* k, const float* v) override;
  void spans(int layer, int32_t n_pending, std::vector<KvSpan>& out) const override;
  void commit(int32_t n) override { size_ += n; }
  void truncate(int32_t n) override { size_ = n < size_ ? n : size_; }

  size_t bytes() const { return k_.size() + v_.size(); }
  int32_t first_pos() const { return first_pos_; }
  KvQuant format() const { return format_; }
  // Row r (< size()) of layer `layer` as kv_dim floats each (exact: F16 widens without loss).
  void row_f32(int layer, int32_t r, float* k, float* v) const;
  // Gives layer `layer`'s pages back to the system; its rows read as zero afterwards (a tail being
  // sealed, layer by layer: Segment::from_tail).
  void release_layer(int layer);
  // Appends this cache's spans (without pending rows) to out.
  void append_spans(int layer, int32_t n_pending, std::vector<KvSpan>& out) const;

 private:
  size_t offset(int layer, int32_t r) const { return (static_cast<size_t>(layer) * capacity_ + r) * row_bytes_; }
  int32_t capacity_;
  int32_t n_head_kv_;
  int32_t head_dim_;
  int32_t first_pos_;
  KvQuant format_;
  size_t row_bytes_;   // one row (all KV heads)
  size_t head_bytes_;  // one head's vector within it
  int32_t size_ = 0;
  std::vector<uint8_t> k_, v_;  // [layer][capacity][row_bytes]
};

}  // namespace towers
