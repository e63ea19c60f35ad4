// Synthetic models: GGUF files with the exact shapes of real models, random weights and a real
// tokenizer. They exist so that speed and memory can be measured on real-sized files without
// downloading weights; they load in any GGUF reader (standard keys only).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "engine/gguf/ggml_type.h"
#include "engine/base/status.h"

namespace towers {

struct SynthShape {
  std::string name;  // e.g. "llama3.2-1b"
  std::string arch;  // "llama" or "qwen2"
  int n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
  float rope_base;
  bool tied_embeddings;
  float llama3_rope_factor;  // 0: no llama3 rope scaling
  std::string tokenizer;     // "llama3", "qwen2" or "generated"
};

const std::vector<SynthShape>& synth_shapes();
std::string synth_shape_names();  // "llama3.2-1b, llama3.1-8b, ..."
std::string synth_type_names();   // "f16, q8_0, q4_0, q5_1, q2_k, q3_k_m, q4_k_m, q5_k_m, iq4_nl, iq4_xs"

struct SynthOptions {
  std::string shape = "tiny";
  std::string type = "q4_0";
  std::string out;
  uint64_t seed = 1;
  int threads = 0;
  // A Hugging Face tokenizer.json or a GGUF whose tokenizer.* keys to copy. Empty: the shape's
  // tokenizer is looked up as <shared_dir>/tokenizers/{llama3,qwen3}.tokenizer.json, and a generated
  // byte-level vocabulary is used (with a warning) when that is absent.
  std::string tokenizer_path;
  std::string shared_dir;
  std::function<void(const std::string& line)> log;
};

// Writes the model; the tensor type of every weight follows llama.cpp's mixing rules for that file type.
Status synthesize_model(const SynthOptions& options);

}  // namespace towers
