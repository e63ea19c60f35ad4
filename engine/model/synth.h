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
  std::string arch;  // general.architecture: llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen2moe, qwen3moe, olmoe
  int n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
  float rope_base;
  bool tied_embeddings;
  float llama3_rope_factor;  // 0: no llama3 rope scaling
  std::string tokenizer;     // "llama3", "qwen2" or "generated"
  // The newer families' hyper-parameters, written under the keys their converters use (0: absent).
  int head_dim = 0;              // attention.key_length/value_length; 0: n_embd / n_head
  int sliding_window = 0;        // attention.sliding_window (gemma2, gemma3)
  float attn_softcap = 0;        // attn_logit_softcapping (gemma2)
  float final_softcap = 0;       // final_logit_softcapping (gemma2)
  float rope_linear_scale = 0;   // rope.scaling.type linear with this factor (gemma3 4B and up)
  // Weights are uniform with this standard deviation; norm weights are 1 +- norm_jitter / 2. The tiny
  // reference shapes use large weights and jittered norms so that every trait moves the logits.
  float weight_std = 0.02f;
  float norm_jitter = 0;
  // Mixtures of experts (n_expert > 0): expert_count, expert_used_count, the experts' width (written as
  // expert_feed_forward_length for the qwen MoE families, as feed_forward_length = n_ff for llama and
  // olmoe, whose n_ff then is this width), qwen2moe's shared expert width.
  int n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
  // phi3 LongRoPE: rope.scaling.original_context_length (0: no rope scaling) and the
  // rope_factors_long/short tensors and attn_factor its converter writes.
  int rope_ctx_orig = 0;
  int rope_dims = 0;  // rope.dimension_count when only part of a head rotates (Phi-4-mini: 96 of 128); 0: all
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
