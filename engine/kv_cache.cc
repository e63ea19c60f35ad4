#include "engine/kv_cache.h"

namespace towers {

DenseKvCache::DenseKvCache(const ModelConfig& config, int32_t capacity)
    : capacity_(capacity), kv_dim_(config.kv_dim()) {
  size_t n = static_cast<size_t>(config.n_layer) * capacity_ * kv_dim_;
  k_.assign(n, 0.0f);
  v_.assign(n, 0.0f);
}

void DenseKvCache::spans(int layer, int32_t n_pending, std::vector<KvSpan>& out) const {
  out.clear();
  size_t base = static_cast<size_t>(layer) * capacity_ * kv_dim_;
  out.push_back(KvSpan{0, size_ + n_pending, KvFormat::F32, k_.data() + base, v_.data() + base});
}

}  // namespace towers
