// Rotary position embedding: rotating head vectors by position, and moving already-rotated keys to
// another position (the RoPE shift that lets a segment computed at one position serve at another).
// Layers may rotate differently (gemma3's windowed layers have their own base), so every call names
// its layer.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/model/model.h"

namespace towers {

class Rope {
 public:
  explicit Rope(const ModelConfig& config);
  // Rotates the first n_rot dimensions of each of n_heads vectors (head_dim apart) by `pos`, with
  // the frequencies of `layer`. pos may be negative: rotating by -d undoes rotating by d. A pure
  // rotation: what a RoPE shift of already embedded keys or queries needs.
  void rotate(float* vecs, int n_heads, float pos, int layer) const;
  // The position embedding of fresh q or k heads: rotate by `pos`, and scale the rotated dimensions by
  // the model's rope.scaling.attn_factor (phi3 LongRoPE; 1 elsewhere), as HF scales cos and sin.
  void embed(float* vecs, int n_heads, float pos, int layer) const;
  int head_dim() const { return head_dim_; }

 private:
  void apply(float* vecs, int n_heads, float pos, int layer, float magnitude) const;
  int head_dim_, half_;
  float attn_factor_;
  bool neox_;
  // Angle per unit of position, per rotated pair: [0] for the model's layers, [1] for windowed layers
  // with a base of their own (ModelConfig::rope_base_swa).
  std::vector<float> inv_freq_[2];
  std::vector<uint8_t> table_of_layer_;
};

}  // namespace towers
