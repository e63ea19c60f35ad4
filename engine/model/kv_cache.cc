#include "engine/model/kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

namespace towers {

DenseKvCache::DenseKvCache(const ModelConfig& config, int32_t capacity, int32_t first_pos, KvQuant format)
    : capacity_(capacity),
      n_head_kv_(config.n_head_kv),
      head_dim_(config.head_dim),
      first_pos_(first_pos),
      format_(format),
      row_bytes_(simd::kv_vec_bytes(format, config.head_dim) * config.n_head_kv),
      head_bytes_(simd::kv_vec_bytes(format, config.head_dim)) {
  const size_t n = static_cast<size_t>(config.n_layer) * capacity_ * row_bytes_;
  k_.assign(n, 0);
  v_.assign(n, 0);
}

// Head by head, as attention reads a span (KvSpan::head_bytes apart).
void DenseKvCache::put_pending(int layer, int32_t i, const float* k, const float* v) {
  const size_t at = offset(layer, size_ + i);
  for (int h = 0; h < n_head_kv_; ++h) {
    simd::kv_quantize(format_, k + h * head_dim_, &k_[at + h * head_bytes_], head_dim_);
    simd::kv_quantize(format_, v + h * head_dim_, &v_[at + h * head_bytes_], head_dim_);
  }
}

void DenseKvCache::row_f32(int layer, int32_t r, float* k, float* v) const {
  const size_t at = offset(layer, r);
  for (int h = 0; h < n_head_kv_; ++h) {
    simd::kv_dequantize(format_, &k_[at + h * head_bytes_], k + h * head_dim_, head_dim_);
    simd::kv_dequantize(format_, &v_[at + h * head_bytes_], v + h * head_dim_, head_dim_);
  }
}

void DenseKvCache::release_layer(int layer) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t layer_bytes = static_cast<size_t>(capacity_) * row_bytes_;
  for (std::vector<uint8_t>* buf : {&k_, &v_}) {
    // The whole pages inside the layer's bytes (its edge pages are shared with the next layer).
    const auto begin = reinterpret_cast<uintptr_t>(buf->data() + offset(layer, 0));
    const uintptr_t first = (begin + page - 1) / page * page, last = (begin + layer_bytes) / page * page;
    if (last > first) (void)madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  }
}

void DenseKvCache::append_spans(int layer, int32_t n_pending, std::vector<KvSpan>& out) const {
  if (size_ + n_pending == 0) return;
  KvSpan s;
  s.pos0 = first_pos_;
  s.n = size_ + n_pending;
  s.format = format_;
  s.k = &k_[offset(layer, 0)];
  s.v = &v_[offset(layer, 0)];
  s.row_bytes = row_bytes_;
  s.head_bytes = head_bytes_;
  out.push_back(s);
}

void DenseKvCache::spans(int layer, int32_t n_pending, std::vector<KvSpan>& out) const {
  out.clear();
  append_spans(layer, n_pending, out);
}

}  // namespace towers
