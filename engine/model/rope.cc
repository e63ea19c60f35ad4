#include "engine/model/rope.h"

#include <cmath>

#include "simd/ops.h"

namespace towers {

namespace {

std::vector<float> inverse_frequencies(int n_rot, double base, const std::vector<float>& factors, float scale) {
  std::vector<float> inv(n_rot / 2);
  for (int i = 0; i < n_rot / 2; ++i) {
    double f = std::pow(base, -2.0 * i / n_rot);
    if (!factors.empty()) f /= factors[i];
    inv[i] = static_cast<float>(f / scale);
  }
  return inv;
}

}  // namespace

Rope::Rope(const ModelConfig& c)
    : head_dim_(c.head_dim), half_(c.n_rot / 2), attn_factor_(c.rope_attn_factor), neox_(c.rope_style == RopeStyle::Neox) {
  inv_freq_[0] = inverse_frequencies(c.n_rot, c.rope_base, c.rope_freq_factors, c.rope_scale);
  table_of_layer_.assign(c.n_layer, 0);
  if (c.rope_base_swa > 0) {
    // Local layers rotate with their own base and neither long-context factors nor scaling (HF gemma3's
    // rotary_emb_local: rope_local_base_freq with the default rope type).
    inv_freq_[1] = inverse_frequencies(c.n_rot, c.rope_base_swa, {}, 1.0f);
    for (int l = 0; l < c.n_layer; ++l) table_of_layer_[l] = c.is_swa(l) ? 1 : 0;
  }
}

void Rope::rotate(float* vecs, int n_heads, float pos, int layer) const { apply(vecs, n_heads, pos, layer, 1.0f); }

void Rope::embed(float* vecs, int n_heads, float pos, int layer) const {
  apply(vecs, n_heads, pos, layer, attn_factor_);
}

void Rope::apply(float* vecs, int n_heads, float pos, int layer, float magnitude) const {
  const std::vector<float>& inv_freq = inv_freq_[table_of_layer_[layer]];
  float cos_t[256], sin_t[256];  // n_rot <= head_dim <= 512 is checked at load; half <= 256
  for (int i = 0; i < half_; ++i) {
    const float angle = pos * inv_freq[i];
    cos_t[i] = magnitude * std::cos(angle);
    sin_t[i] = magnitude * std::sin(angle);
  }
  for (int h = 0; h < n_heads; ++h) {
    simd::rope_f32(vecs + static_cast<size_t>(h) * head_dim_, cos_t, sin_t, static_cast<size_t>(half_), neox_);
  }
}

}  // namespace towers
