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
  // F32 storage for pending row i (< n_pending) of `layer`, filled by eval before commit().
  virtual float* pending_k(int layer, int32_t i) = 0;
  virtual float* pending_v(int layer, int32_t i) = 0;
  // Spans of `layer` covering committed rows plus the first n_pending pending rows, in position order.
  virtual void spans(int layer, int32_t n_pending, std::vector<KvSpan>& out) const = 0;
  virtual void commit(int32_t n) = 0;
  // Forgets rows from n on (n <= size()).
  virtual void truncate(int32_t n) = 0;
};

// F32 rows for positions [first_pos, first_pos + capacity): one session's private cache, or the
// growing tail of a tower.
class DenseKvCache final : public KvCache {
 public:
  DenseKvCache(const ModelConfig& config, int32_t capacity, int32_t first_pos = 0);
  int32_t size() const override { return size_; }
  int32_t next_pos() const override { return first_pos_ + size_; }
  int32_t capacity() const override { return capacity_; }
  float* pending_k(int layer, int32_t i) override { return row(k_, layer, size_ + i); }
  float* pending_v(int layer, int32_t i) override { return row(v_, layer, size_ + i); }
  void spans(int layer, int32_t n_pending, std::vector<KvSpan>& out) const override;
  void commit(int32_t n) override { size_ += n; }
  void truncate(int32_t n) override { size_ = n < size_ ? n : size_; }

  size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }
  int32_t first_pos() const { return first_pos_; }
  // Row r (< size()) of layer `layer`: kv_dim floats.
  const float* k_row(int layer, int32_t r) const { return row(k_, layer, r); }
  const float* v_row(int layer, int32_t r) const { return row(v_, layer, r); }
  // Appends this cache's spans (without pending rows) to out.
  void append_spans(int layer, int32_t n_pending, std::vector<KvSpan>& out) const;

 private:
  float* row(std::vector<float>& buf, int layer, int32_t r) {
    return buf.data() + (static_cast<size_t>(layer) * capacity_ + r) * kv_dim_;
  }
  const float* row(const std::vector<float>& buf, int layer, int32_t r) const {
    return buf.data() + (static_cast<size_t>(layer) * capacity_ + r) * kv_dim_;
  }
  int32_t capacity_;
  int32_t kv_dim_;
  int32_t head_dim_;
  int32_t first_pos_;
  int32_t size_ = 0;
  std::vector<float> k_, v_;  // [layer][capacity][kv_dim]
};

}  // namespace towers
