// A loaded model: hyper-parameters read from GGUF metadata and weight views into the mapped file.
// Supported architectures: llama (Llama 1/2/3.x, Mistral, TinyLlama, SmolLM) and qwen2.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/gguf/gguf.h"
#include "engine/base/huge_buffer.h"
#include "engine/base/status.h"

namespace towers {

class Tokenizer;

enum class Arch { Llama, Qwen2 };
// Normal: rotate adjacent pairs (x[2i], x[2i+1]) — llama.cpp's LLAMA_ROPE_TYPE_NORM, used by `llama`
// (its converter permutes Q/K for it). Neox: rotate (x[i], x[i+n_rot/2]) — used by `qwen2`.
enum class RopeStyle { Normal, Neox };

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
  std::vector<float> rope_freq_factors;  // llama3 long-context factors (n_rot/2), empty if none
  float norm_eps = 1e-5f;
  bool tied_embeddings = false;
  bool qkv_bias = false;

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
  size_t row_stride() const { return row_bytes(type, static_cast<uint64_t>(cols)); }
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_stride(); }
  explicit operator bool() const { return data != nullptr; }
};

struct LayerWeights {
  Weight attn_norm, wq, wk, wv, wo;
  Weight bq, bk, bv;  // qwen2 only (rows == 1)
  Weight ffn_norm, w_gate, w_up, w_down;
};

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

 private:
  Model() = default;
  void pack_weights();
  HugeBuffer packed_store_;  // all packed copies, on huge pages: decode streams them once per token
  size_t packed_bytes_ = 0;
  std::shared_ptr<GgufFile> file_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

std::string_view supported_architectures();

}  // namespace towers
