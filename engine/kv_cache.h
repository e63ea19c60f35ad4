// How the forward pass stores and reads keys and values.
// Attention sees a layer's cache as an ordered list of spans: runs of rows stored contiguously in one
// format, each row carrying K (already rotated for its position) and V for every KV head. A per-session
// dense cache is one span per layer; a tower of shared segments is one span per segment, read in place.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/model.h"
#include "engine/status.h"

namespace towers {

enum class KvFormat { F32 };

struct KvSpan {
  int32_t pos0 = 0;  // position of the first row; row i sits at pos0 + i
  int32_t n = 0;     // rows
  KvFormat format = KvFormat::F32;
  const float* k = nullptr;  // [n][kv_dim]
  const float* v = nullptr;  // [n][kv_dim]
};

class KvCache {
 public:
  virtual ~KvCache() = default;
  // Rows committed so far; the next token goes to position next_pos().
  virtual int32_t size() const = 0;
  virtual int32_t next_pos() const = 0;
  virtual int32_t capacity() const = 0;
  // Storage for row size()+i of `layer` (i < n_pending) that eval fills before commit().
  virtual float* pending_k(int layer, int32_t i) = 0;
  virtual float* pending_v(int layer, int32_t i) = 0;
  // Spans of `layer` covering committed rows plus the first n_pending pending rows.
  virtual void spans(int layer, int32_t n_pending, std::vector<KvSpan>& out) const = 0;
  virtual void commit(int32_t n) = 0;
  // Forgets rows from n on (n <= size()).
  virtual void truncate(int32_t n) = 0;
};

// One session's private cache: F32 rows for positions [0, capacity).
class DenseKvCache final : public KvCache {
 public:
  DenseKvCache(const ModelConfig& config, int32_t capacity);
  int32_t size() const override { return size_; }
  int32_t next_pos() const override { return size_; }
  int32_t capacity() const override { return capacity_; }
  float* pending_k(int layer, int32_t i) override { return row(k_, layer, size_ + i); }
  float* pending_v(int layer, int32_t i) override { return row(v_, layer, size_ + i); }
  void spans(int layer, int32_t n_pending, std::vector<KvSpan>& out) const override;
  void commit(int32_t n) override { size_ += n; }
  void truncate(int32_t n) override { size_ = n < size_ ? n : size_; }
  size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

 private:
  float* row(std::vector<float>& buf, int layer, int32_t r) {
    return buf.data() + (static_cast<size_t>(layer) * capacity_ + r) * kv_dim_;
  }
  int32_t capacity_;
  int32_t kv_dim_;
  int32_t size_ = 0;
  std::vector<float> k_, v_;  // [layer][capacity][kv_dim]
};

}  // namespace towers
