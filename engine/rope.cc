#include "engine/rope.h"

#include <cmath>

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
    float* v = vecs + static_cast<size_t>(h) * head_dim_;
    for (int i = 0; i < half_; ++i) {
      const int a = neox_ ? i : 2 * i, b = neox_ ? i + half_ : 2 * i + 1;
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * cos_t[i] - x1 * sin_t[i];
      v[b] = x0 * sin_t[i] + x1 * cos_t[i];
    }
  }
}

}  // namespace towers
