#include "engine/model/rope.h"

#include <cmath>

#include "simd/ops.h"

namespace towers {

Rope::Rope(const ModelConfig& c)
    : head_dim_(c.head_dim), half_(c.n_rot / 2), neox_(c.rope_style == RopeStyle::Neox) {
  inv_freq_.resize(half_);
  for (int i = 0; i < half_; ++i) {
    double f = std::pow(static_cast<double>(c.rope_base), -2.0 * i / c.n_rot);
    if (!c.rope_freq_factors.empty()) f /= c.rope_freq_factors[i];
    inv_freq_[i] = static_cast<float>(f / c.rope_scale);
  }
}

void Rope::rotate(float* vecs, int n_heads, float pos) const {
  float cos_t[256], sin_t[256];  // n_rot <= head_dim <= 512 is checked at load; half <= 256
  for (int i = 0; i < half_; ++i) {
    const float angle = pos * inv_freq_[i];
    cos_t[i] = std::cos(angle);
    sin_t[i] = std::sin(angle);
  }
  for (int h = 0; h < n_heads; ++h) {
    simd::rope_f32(vecs + static_cast<size_t>(h) * head_dim_, cos_t, sin_t, static_cast<size_t>(half_), neox_);
  }
}

}  // namespace towers
