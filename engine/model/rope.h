// Rotary position embedding: rotating head vectors by position, and moving already-rotated keys to
// another position (the RoPE shift that lets a segment computed at one position serve at another).
#pragma once
#include <cstdint>
#include <vector>

#include "engine/model/model.h"

namespace towers {

class Rope {
 public:
  explicit Rope(const ModelConfig& config);
  // Rotates the first n_rot dimensions of each of n_heads vectors (head_dim apart) by `pos`.
  // pos may be negative: rotating by -d undoes rotating by d.
  void rotate(float* vecs, int n_heads, float pos) const;
  int head_dim() const { return head_dim_; }

 private:
  int head_dim_, half_;
  bool neox_;
  std::vector<float> inv_freq_;  // angle per unit of position, per rotated pair
};

}  // namespace towers
