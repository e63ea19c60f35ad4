// The reference forward pass: a whole transformer step, written to be read in one sitting (in the
// spirit of llama2.c's run.c), for every supported family: what Qwen3, Gemma 2/3, Phi-3 and the
// mixtures of experts do differently from Llama is a few fields of ModelConfig read in the one loop
// (q/k norms, post-norms, GeGLU, soft-caps, sliding windows, RoPE magnitude, expert routing; fused
// tensors are bound as views at load). Batched: T tokens per call (prefill) or one (decode).
// Every output element is computed by one thread in a fixed order, so logits are bit-identical for any
// thread count and for any way of splitting a prompt into batches (docs/numerics.md).
#pragma once
#include <span>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "engine/model/rope.h"
#include "engine/base/thread_pool.h"
#include "simd/int8_attention.h"
#include "simd/quant_dot.h"

namespace towers {

// Hidden: no logits; every token's final hidden state (after the output norm, before the output
// projection: n_embd floats a token), for embeddings. A batch asks for Hidden in all its sequences or
// in none.
enum class Logits { Last, All, Hidden };

// Kernels: Reference dequantizes each weight row to f32 and takes f32 dot products (exact reading of
// the file, the path the reference tests pin down). Fast quantizes the activations to 8 bits per block
// and uses integer dot products against the quantized weights (llama.cpp's arithmetic); f32/f16/bf16
// weights take the same f32 path in both.
enum class Kernels { Reference, Fast };

// Where the forward pass rounds to f16 as ggml does (Forward::set_rounding).
enum class Rounding : uint8_t { Ggml, F32 };

// Which weight types the fast kernels read through their packed (16-row interleaved) copies
// (Forward::set_packed_set); the others take gemm_q's per-row kernels, which round otherwise. Numbered
// in the order they were added: the codec's store header records the number (docs/codec.md).
enum class PackedSet : uint8_t {
  Classic = 0,   // Q4_0, Q8_0, Q4_K, Q6_K: every store written before Extended (flags bits 2-3 zero)
  Extended = 1,  // every type gemm_q reads (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS too)
};
constexpr PackedSet kLatestPackedSet = PackedSet::Extended;
// Whether the packed copy of a matrix of this GGUF type is read under `set`.
bool reads_packed(PackedSet set, uint32_t ggml_type);

class Forward {
 public:
  Forward(const Model& model, ThreadPool& pool, Kernels kernels = Kernels::Fast);
  Kernels kernels() const { return kernels_; }

  // Runs `tokens` at positions cache.next_pos()..., appending their K/V to `cache`.
  // logits receives n_vocab floats for the last token (Logits::Last) or for every token (All), or
  // n_embd floats of hidden state for every token (Hidden).
  Status eval(KvCache& cache, std::span<const int32_t> tokens, Logits which, std::vector<float>& logits);

  // Several sequences in one step (batched decode of many sessions, or prefill beside decode): the
  // weight matrices are read once for all tokens of all sequences. logits holds, sequence after
  // sequence, the rows each one asked for. A sequence's logits are bit-identical to evaluating it alone.
  struct Sequence {
    KvCache* cache;
    std::span<const int32_t> tokens;
    Logits which = Logits::Last;
  };
  Status eval_batch(std::span<const Sequence> batch, std::vector<float>& logits);

  // Prefill through oneDNN's int8 GEMM (simd/onednn_matmul.h): a step of at least `min_tokens` tokens
  // multiplies the matrices that have an int8 copy (Model::build_int8_copies) with it instead of the
  // fast kernels; 0 (the default) never. Another arithmetic (7-bit weights, 8-bit activations, one
  // scale per row or group each; docs/numerics.md, "oneDNN prefill kernels"): a token's logits still
  // do not depend on the batch or the threads among steps that take it, but a step below the threshold
  // gives the fast kernels' logits, so the codec turns it off for its passes (docs/codec.md).
  // Only with Kernels::Fast. kOnednnMinTokens: where oneDNN starts to win on this machine (AVX2, 2
  // threads, 1B Q4_0, per-run ratios to the fast kernels in alternation: pp32 0.85x, pp64 1.11x, pp128
  // 1.16x, pp512 1.40x; bench/README.md, "oneDNN in the prefill path").
  // kOnednnMinTokensPacked: with the copies packed into oneDNN's layout (Model::int8_copies_packed: its
  // VNNI kernels on 16-token tiles), measured the same way on AVX-512 VNNI: pp8 0.98x, pp16 1.47x,
  // pp32 1.44x, pp64 1.61x, pp512 1.60x. onednn_min_tokens_for picks the one for a model's copies.
  static constexpr int kOnednnMinTokens = 64;
  static constexpr int kOnednnMinTokensPacked = 16;
  static int onednn_min_tokens_for(const Model& m) {
    return m.int8_copies_packed() ? kOnednnMinTokensPacked : kOnednnMinTokens;
  }
  void set_onednn_min_tokens(int min_tokens) { onednn_min_tokens_ = min_tokens; }
  int onednn_min_tokens() const { return onednn_min_tokens_; }
  // int8 attention in the steps that take oneDNN (Full by default; only where the CPU has AVX-512
  // VNNI, simd::int8_attention_available): a tile's whole blocks of F32/F16 KV rows (a prompt's own
  // rows, an F16 lease tail) scored (Scores), and summed too (Full), with int8 products, each block's
  // K and V quantized once per layer for all tiles (simd/int8_attention.h; docs/numerics.md, "int8
  // prefill attention"). Windowed layers, quantized spans and a row's last partial block keep the
  // exact kernels. It rides on the oneDNN threshold so that one switch (set_onednn_min_tokens(0), what
  // the codec does) gives back the fast kernels' arithmetic everywhere.
  enum class Int8Attention : uint8_t { Off, Scores, Full };
  void set_int8_attention(Int8Attention a) { int8_attention_ = a; }
  Int8Attention int8_attention() const { return int8_attention_; }
  // Whether a step of T tokens runs int8 attention.
  bool int8_attention_for(int T) const;
  // Rounding::Ggml (the default) rounds where ggml's CPU backend rounds to f16, so that logits follow
  // llama.cpp's: the scales of 32-element activation blocks (simd::ActScales::F16: Q4_0, Q4_1, Q5_0,
  // Q5_1, Q8_0 and IQ4_NL weights, fast kernels) and GeGLU's gate (simd::geglu_f32_ggml: Gemma, both
  // kernel sets). Rounding::F32 keeps both in f32: Towers' arithmetic before 2026-11-27, kept because
  // the codec switches to what a store header records for its passes, so records coded either way
  // still decode (docs/numerics.md, docs/codec.md).
  void set_rounding(Rounding r) { rounding_ = r; }
  Rounding rounding() const { return rounding_; }
  // kLatestPackedSet (the default): every packed copy the model has. An older set: the types added
  // since take gemm_q, as Towers did when a store's records were coded (the codec switches to the set
  // its store header records for its passes).
  void set_packed_set(PackedSet s) { packed_set_ = s; }
  PackedSet packed_set() const { return packed_set_; }
  // How oneDNN's calls are threaded: slices of rows on our pool, OpenMP limited to one thread per call
  // (the default, and faster), or one call per matrix on oneDNN's own OpenMP team of pool.size()
  // threads while the pool's workers idle (kept to measure it: `bench_prefill_onednn MODEL 2 3 128 1`;
  // plain copies only: packed ones always run in the pool's slices).
  void set_onednn_openmp(bool on) { onednn_omp_ = on; }

  // Benchmarks: when on, eval adds the wall time of every attention() call (one clock read before and
  // after each layer's attention, none inside it) to attention_seconds(). Off by default.
  void set_attention_timing(bool on) { time_attention_ = on; }
  double attention_seconds() const { return attention_s_; }
  void reset_attention_seconds() { attention_s_ = 0; }

  // Query rows per prefill attention tile (attention()): consecutive tokens of one sequence that read
  // each block of a KV head once for all of their query heads. 0 (the default): kAttentionTileQueries
  // query heads per tile. Any value gives the same bits (tests compare 1, the untiled walk, with others).
  static constexpr int kAttentionTileQueries = 64;
  void set_attention_tile_rows(int rows) { tile_rows_ = rows; }

  // Bytes of weights read since the last reset: every matrix a step multiplies by, once per step
  // whatever its number of tokens (a mixture of experts: only the experts some token chose), and one
  // embedding row per token. Divided by the decode steps, the bytes a token streams from memory.
  uint64_t weight_bytes_read() const { return weight_bytes_read_; }
  void reset_weight_bytes_read() { weight_bytes_read_ = 0; }

 private:
  void embed();
  void rmsnorm(const float* x, const Weight& w, float* out, int rows);
  void add_residual(const Weight& post_norm, int T);
  void matmul(const Weight& w, const float* x, int T, float* y);
  // Several matrices reading the same input x (Q/K/V, gate/up): one activation quantization and one
  // parallel loop over all of their rows. Results are those of separate matmul calls.
  struct MatOut {
    const Weight* w;
    float* y;
  };
  void matmuls(std::span<const MatOut> mats, const float* x, int T);
  void matmul_f32(const Weight& w, const float* x, int T, float* y);  // dequantize + f32 dot
  void matmuls_onednn(std::span<const MatOut> mats, const float* x, int T);
  void add_bias(const Weight& b, float* y, int T);
  struct FfnBlock {
    const Weight *gate, *up, *down;
    float* out;  // [T][n_embd]
  };
  void ffn(std::span<const FfnBlock> blocks, const float* x, int T);
  void moe(const LayerWeights& L, int T);
  void rope(float* vecs, int T, int n_heads, int layer);
  void attention(std::span<const Sequence> batch, int layer, int T);

  const Model& model_;
  const ModelConfig& cfg_;
  ThreadPool& pool_;
  Kernels kernels_;
  Rope rope_;
  // Activations, [T][width] each.
  std::vector<float> x_, xb_, q_, k_, v_, att_, hb_, hb2_;
  std::vector<std::vector<float>> scratch_;  // per thread: a dequantized row, attention scores
  // Per token of the current batch: its id, its sequence, its position.
  std::vector<int32_t> tok_, seq_of_, pos_;
  std::vector<std::vector<KvSpan>> spans_;  // per sequence, for the current layer
  struct AttentionTile {
    int32_t t0, n;  // tokens [t0, t0 + n) of one sequence
  };
  std::vector<AttentionTile> tiles_;  // the current batch's attention tiles, in zigzag order
  // int8 attention: per (sequence, span) the index of its first block in int8_keys_ / int8_values_
  // (blocks of KV head h at first + h * blocks + i), or -1 when the span keeps the exact kernels.
  struct Int8Span {
    int64_t first = -1;
    int32_t blocks = 0;
  };
  std::vector<std::vector<Int8Span>> int8_spans_;
  std::vector<simd::Int8Keys> int8_keys_;
  std::vector<simd::Int8Values> int8_values_;  // empty blocks unless Full
  void build_int8_blocks(std::span<const Sequence> batch, int T);
  int tile_rows_ = 0;
  std::vector<uint8_t> act_;  // activations quantized for the fast kernels, [T][act_bytes]
  std::vector<int8_t> act8_;  // and for oneDNN, [T][cols], with [T][groups] scales
  std::vector<float> act8_scales_;
  int onednn_min_tokens_ = 0;
  Int8Attention int8_attention_ = Int8Attention::Full;
  Rounding rounding_ = Rounding::Ggml;
  PackedSet packed_set_ = kLatestPackedSet;
  bool onednn_omp_ = false;
  // Mixture of experts: router probabilities [T][n_expert], each token's experts and weights by rank
  // [T][n_expert_used], the experts' outputs per (token, rank) [T][n_expert_used][n_embd], one expert's
  // gathered inputs and outputs, the shared expert's gate per token.
  std::vector<float> router_, chosen_w_, slots_, expert_x_, expert_y_, shared_gate_;
  std::vector<int32_t> chosen_;
  uint64_t weight_bytes_read_ = 0;
  bool time_attention_ = false;
  double attention_s_ = 0;
};

}  // namespace towers
