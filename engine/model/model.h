// A loaded model: hyper-parameters read from GGUF metadata and weight views into the mapped file.
// Supported architectures: llama (Llama 1/2/3.x, Mistral, TinyLlama, SmolLM, and Mixtral-style mixtures
// of experts), qwen2, qwen3, gemma2, gemma3 (text), phi3 (Phi-3, 3.5, Phi-4, Phi-4-mini), and the
// mixtures of experts qwen2moe, qwen3moe and olmoe. What differs between them is a handful of fields of
// ModelConfig, set from one table in model.cc; the forward pass (forward.cc) is one loop that reads
// those fields.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/gguf/gguf.h"
#include "engine/base/huge_buffer.h"
#include "engine/base/status.h"
#include "engine/base/thread_pool.h"

namespace towers {

class Tokenizer;

enum class Arch { Llama, Qwen2, Qwen3, Gemma2, Gemma3, Phi3, Qwen2Moe, Qwen3Moe, OlMoe };
// Normal: rotate adjacent pairs (x[2i], x[2i+1]) — llama.cpp's LLAMA_ROPE_TYPE_NORM, used by `llama`
// (its converter permutes Q/K for it). Neox: rotate (x[i], x[i+n_rot/2]) — used by qwen2/3, gemma2/3.
enum class RopeStyle { Normal, Neox };
// The feed-forward gate: SwiGLU (silu(gate) * up; llama, qwen) or GeGLU (gelu_tanh(gate) * up; gemma).
enum class FfnGate { Silu, GeluTanh };

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string arch_name;  // as in general.architecture
  std::string name;       // general.name, if any
  int n_vocab = 0;
  int n_embd = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;  // per-head size of Q/K/V
  int n_ff = 0;
  int n_ctx_train = 0;
  int n_rot = 0;  // dimensions of each head that RoPE rotates
  float rope_base = 10000.0f;
  float rope_scale = 1.0f;  // linear scaling: positions are divided by this
  RopeStyle rope_style = RopeStyle::Normal;
  // Frequency divisors per rotated pair (n_rot/2), empty if none: llama3's rope_freqs, or phi3's LongRoPE
  // factors — rope_factors_long when the served context (n_ctx_train) exceeds rope_ctx_orig, else
  // rope_factors_short, chosen once at load as llama.cpp chooses them by context size, so that RoPE stays
  // a function of relative position (segment shifts remain exact rotations).
  std::vector<float> rope_freq_factors;
  int rope_ctx_orig = 0;          // rope.scaling.original_context_length (phi3 LongRoPE); 0: absent
  float rope_attn_factor = 1.0f;  // rope.scaling.attn_factor: the rotated dimensions of q and k are scaled by it
  float norm_eps = 1e-5f;
  bool tied_embeddings = false;
  bool qkv_bias = false;

  // Family traits (the architecture table in model.cc; defaults are llama's).
  float embd_scale = 1.0f;        // embeddings are multiplied by this (gemma: sqrt(n_embd))
  FfnGate ffn_gate = FfnGate::Silu;
  bool qk_norm = false;           // RMSNorm of every q and k head before RoPE (qwen3, gemma3)
  bool qk_norm_whole = false;     // with qk_norm: one RMSNorm over all heads of q, one over k (olmoe)
  bool post_norms = false;        // RMSNorm of the attention and FFN outputs before each residual add (gemma)
  float attn_scale = 0;           // score scale; set to 1/sqrt(head_dim) at load unless the family says otherwise
  float attn_softcap = 0;         // scores become cap * tanh(score / cap) (gemma2); 0: none
  float final_softcap = 0;        // the same on the output logits (gemma2); 0: none
  // Sliding-window attention: a layer with swa_layer[l] attends only to positions p with
  // q_pos - p < sliding_window (gemma2: even layers; gemma3: all but every sixth). Empty: none.
  int sliding_window = 0;
  std::vector<uint8_t> swa_layer;
  // Windowed layers' own RoPE base, without scaling (gemma3's local layers); 0: the same as the others.
  float rope_base_swa = 0;


  // Mixture of experts (n_expert > 0): the feed-forward block is n_expert_used of n_expert experts (each a
  // SwiGLU of width n_ff_exp) chosen per token by softmax over the router's logits then top-k, their
  // outputs weighted by those probabilities (renormalised to sum 1 when expert_weights_norm), plus, with
  // n_ff_shexp > 0, a shared expert of that width scaled by sigmoid(gate_inp_shexp · x) (qwen2moe).
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_exp = 0;
  int n_ff_shexp = 0;
  bool expert_weights_norm = false;

  bool is_moe() const { return n_expert > 0; }
  bool is_swa(int layer) const { return !swa_layer.empty() && swa_layer[layer]; }
  int kv_dim() const { return n_head_kv * head_dim; }
  int q_dim() const { return n_head * head_dim; }
};

// A weight matrix of `rows` rows, each `cols` elements of `type`, row-major in the file.
struct Weight {
  const uint8_t* data = nullptr;
  // Optional load-time copy of the first rows / 16 * 16 rows in simd's packed (row-interleaved)
  // layout (simd/quant_dot.h), used by the fast kernels; the remaining rows are read from data.
  const uint8_t* packed = nullptr;
  GgmlType type = GgmlType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  // Optional copy for oneDNN's prefill GEMM (Model::build_int8_copies): rows x (cols / s8_group) f32
  // scales, row after row, and the weights either as rows x cols s8 (s8) or packed into oneDNN's own
  // layout in slices (s8_packed; whole-row scales only; simd/onednn_matmul.h).
  const int8_t* s8 = nullptr;
  const uint8_t* s8_packed = nullptr;
  const float* s8_scales = nullptr;
  int64_t s8_group = 0;
  size_t row_stride() const { return row_bytes(type, static_cast<uint64_t>(cols)); }
  size_t bytes() const { return static_cast<size_t>(rows) * row_stride(); }
  // Rows r0 .. r0 + n as a matrix of their own (one expert of a stacked tensor, q of a fused qkv).
  Weight slice(int64_t r0, int64_t n) const { return Weight{row(r0), nullptr, type, n, cols}; }
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_stride(); }
  explicit operator bool() const { return data != nullptr; }
};

struct LayerWeights {
  Weight attn_norm, wq, wk, wv, wo;
  Weight bq, bk, bv;                // qwen2 only (rows == 1)
  Weight q_norm, k_norm;            // qk_norm only: head_dim weights shared by every head
  Weight post_attn_norm, post_ffn_norm;  // post_norms only
  Weight ffn_norm, w_gate, w_up, w_down;  // dense feed-forward (phi3's fused ffn_up: views of its halves)
  // Mixture of experts: the router (n_expert rows), each expert's matrices as views into the stacked
  // ffn_{gate,up,down}_exps tensors, and qwen2moe's shared expert and its one-row gate.
  Weight gate_inp;
  std::vector<Weight> gate_exps, up_exps, down_exps;
  Weight gate_inp_shexp, gate_shexp, up_shexp, down_shexp;
};

// Calls f on every matrix of a layer that the matmul kernels read (absent ones included: test `if (w)`).
template <class Layer, class F>
void for_each_matrix(Layer& L, F&& f) {
  for (auto* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down, &L.gate_inp, &L.gate_shexp, &L.up_shexp,
                  &L.down_shexp}) {
    f(*w);
  }
  for (auto* experts : {&L.gate_exps, &L.up_exps, &L.down_exps}) {
    for (auto& w : *experts) f(w);
  }
}

class Model {
 public:
  // Maps the file, reads the configuration, checks every tensor's shape and type.
  static Result<std::unique_ptr<Model>> load(const std::string& path);
  static Result<std::unique_ptr<Model>> from_gguf(std::shared_ptr<GgufFile> file);
  ~Model();

  const ModelConfig& config() const { return config_; }
  const GgufFile& file() const { return *file_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

  Weight tok_embd, output_norm, output;
  std::vector<LayerWeights> layers;

  // Bytes of the packed weight copies made at load (0 when no matrix has a packed layout).
  size_t packed_bytes() const { return packed_bytes_; }
  // Drops from resident memory (madvise MADV_DONTNEED) the file pages that only hold rows of packed
  // matrices, which the fast path never reads; anything that does read them (the reference path,
  // a checksum of the file) faults them back in from the page cache. Done at load; call it again
  // after such a full read. No-op for models not mapped from a file. Returns the bytes released.
  size_t release_packed_sources() const;

  // Prefill through oneDNN (simd/onednn_matmul.h, docs/numerics.md "oneDNN prefill kernels"): a copy of
  // every dense layer matrix (attention, feed-forward; not the output matrix, not experts) as 7-bit
  // weights with one scale per `group` elements of a row (0: the whole row), dequantized from the
  // file's type. Its bytes are resident for as long as the model is; int8_copy_bytes_needed() says how
  // many before building. Built once (a second call does nothing); an error when oneDNN is not
  // available. kInt8Group: oneDNN is called once per group, so larger groups are faster (1B shapes,
  // M = 128: 2.2x our kernels with whole rows, 1.8x with 512, 1.0-1.3x with 256) for the same accuracy
  // on the models measured (docs/numerics.md, "oneDNN prefill kernels").
  // With whole-row scales the weights are packed into oneDNN's layout where this CPU's oneDNN has one
  // (`pack`; the same results bit for bit, 1.2-2.5x faster on AVX-512 VNNI: bench_onednn_pack).
  static constexpr size_t kInt8Group = 0;
  size_t int8_copy_bytes_needed() const;
  Status build_int8_copies(ThreadPool& pool, size_t group = kInt8Group, bool pack = true);
  size_t int8_copy_bytes() const { return int8_bytes_; }
  bool int8_copies_packed() const { return int8_packed_; }

 private:
  Model() = default;
  void pack_weights();
  HugeBuffer packed_store_;  // all packed copies, on huge pages: decode streams them once per token
  size_t packed_bytes_ = 0;
  std::vector<Weight*> int8_matrices();
  HugeBuffer int8_store_;  // the s8 rows (or packed slices) and scales of build_int8_copies
  bool int8_packed_ = false;
  size_t int8_bytes_ = 0;
  std::shared_ptr<GgufFile> file_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

std::string_view supported_architectures();

}  // namespace towers
