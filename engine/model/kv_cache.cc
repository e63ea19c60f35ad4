#include "engine/model/kv_cache.h"

namespace towers {

DenseKvCache::DenseKvCache(const ModelConfig& config, int32_t capacity, int32_t first_pos)
    : capacity_(capacity), kv_dim_(config.kv_dim()), head_dim_(config.head_dim), first_pos_(first_pos) {
  size_t n = static_cast<size_t>(config.n_layer) * capacity_ * kv_dim_;
  k_.assign(n, 0.0f);
  v_.assign(n, 0.0f);
}

void DenseKvCache::append_spans(int layer, int32_t n_pending, std::vector<KvSpan>& out) const {
  if (size_ + n_pending == 0) return;
  KvSpan s;
  s.pos0 = first_pos_;
  s.n = size_ + n_pending;
  s.format = KvQuant::F32;
  s.k = reinterpret_cast<const uint8_t*>(row(k_, layer, 0));
  s.v = reinterpret_cast<const uint8_t*>(row(v_, layer, 0));
  s.row_bytes = static_cast<size_t>(kv_dim_) * sizeof(float);
  s.head_bytes = static_cast<size_t>(head_dim_) * sizeof(float);
  out.push_back(s);
}

void DenseKvCache::spans(int layer, int32_t n_pending, std::vector<KvSpan>& out) const {
  out.clear();
  append_spans(layer, n_pending, out);
}

}  // namespace towers
