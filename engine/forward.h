// The reference forward pass: a whole Llama/Qwen2 transformer step, written to be read in one sitting
// (in the spirit of llama2.c's run.c). Batched: T tokens per call (prefill) or one (decode).
// Every output element is computed by one thread in a fixed order, so logits are bit-identical for any
// thread count and for any way of splitting a prompt into batches (docs/numerics.md).
#pragma once
#include <span>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/thread_pool.h"

namespace towers {

enum class Logits { Last, All };

class Forward {
 public:
  Forward(const Model& model, ThreadPool& pool);

  // Runs `tokens` at positions cache.next_pos()..., appending their K/V to `cache`.
  // logits receives n_vocab floats for the last token (Logits::Last) or for every token (All).
  Status eval(KvCache& cache, std::span<const int32_t> tokens, Logits which, std::vector<float>& logits);

 private:
  void embed(std::span<const int32_t> tokens);
  void rmsnorm(const float* x, const Weight& w, float* out, int T);
  void matmul(const Weight& w, const float* x, int T, float* y);
  void add_bias(const Weight& b, float* y, int T);
  void rope(float* vecs, int T, int n_heads, int32_t pos0);
  void attention(const KvCache& cache, int layer, int T, int32_t pos0);

  const Model& model_;
  const ModelConfig& cfg_;
  ThreadPool& pool_;
  std::vector<float> inv_freq_;  // RoPE angle per position step, per rotated pair
  // Activations, [T][width] each.
  std::vector<float> x_, xb_, q_, k_, v_, att_, hb_, hb2_;
  std::vector<std::vector<float>> scratch_;  // per thread: a dequantized row, attention scores
  std::vector<KvSpan> spans_;
};

}  // namespace towers
