#include "engine/model/model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "engine/text/tokenizer.h"
#include "engine/gguf/quant.h"
#include "simd/onednn_matmul.h"
#include "simd/quant_dot.h"

namespace towers {

namespace {

// Everything an architecture changes in the forward pass, in one row. Metadata read below
// (softcaps, window, attention scale, expert counts) overrides these defaults where the file has it.
enum class Experts { None, Optional, Required };  // Optional: llama is Mixtral-style when expert_count > 0

struct ArchTraits {
  const char* name;
  Arch arch;
  RopeStyle rope_style;
  bool qkv_bias = false, qk_norm = false, post_norms = false;
  bool qk_norm_whole = false;  // olmoe: q_norm/k_norm over the whole projection, not per head
  bool gemma_embedding = false;  // embeddings scaled by sqrt(n_embd), GeGLU feed-forward
  int swa_period = 0;  // 0: no window; P: layer l is windowed unless l % P == P - 1 (llama.cpp's swa pattern)
  bool swa_every_layer = false;  // phi3: every layer windowed when the file's sliding_window > 0 (Phi-4 writes 0)
  float rope_base_swa = 0;       // windowed layers' RoPE base (gemma3: 10000, HF's rope_local_base_freq); 0: shared
  float attn_softcap = 0, final_softcap = 0;  // defaults when the file has no *_logit_softcapping keys
  // Layer count of the one size whose score scale is 1/sqrt(n_embd/n_head) instead of 1/sqrt(head_dim)
  // (the 27B models: HF's query_pre_attn_scalar; llama.cpp recognises them the same way).
  int n_layer_embd_scaled_queries = 0;
  bool fused_ffn_up = false;  // phi3: ffn_up holds gate (first half) and up (second half); no ffn_gate
  Experts experts = Experts::None;
  // Renormalise the chosen experts' weights to sum 1 unless the file's expert_weights_norm says otherwise
  // (HF's norm_topk_prob: Mixtral always, Qwen3-MoE true in its released configs, Qwen2-MoE and OLMoE false).
  bool expert_weights_norm = false;
  bool shared_expert = false;  // qwen2moe: ffn_*_shexp and its sigmoid gate ffn_gate_inp_shexp
};

constexpr ArchTraits kArchitectures[] = {
    {.name = "llama", .arch = Arch::Llama, .rope_style = RopeStyle::Normal, .experts = Experts::Optional,
     .expert_weights_norm = true},
    {.name = "qwen2", .arch = Arch::Qwen2, .rope_style = RopeStyle::Neox, .qkv_bias = true},
    {.name = "qwen3", .arch = Arch::Qwen3, .rope_style = RopeStyle::Neox, .qk_norm = true},
    {.name = "gemma2", .arch = Arch::Gemma2, .rope_style = RopeStyle::Neox, .post_norms = true,
     .gemma_embedding = true, .swa_period = 2, .attn_softcap = 50.0f, .final_softcap = 30.0f,
     .n_layer_embd_scaled_queries = 46},
    {.name = "gemma3", .arch = Arch::Gemma3, .rope_style = RopeStyle::Neox, .qk_norm = true, .post_norms = true,
     .gemma_embedding = true, .swa_period = 6, .rope_base_swa = 10000.0f, .n_layer_embd_scaled_queries = 62},
    {.name = "phi3", .arch = Arch::Phi3, .rope_style = RopeStyle::Neox, .swa_every_layer = true, .fused_ffn_up = true},
    {.name = "qwen2moe", .arch = Arch::Qwen2Moe, .rope_style = RopeStyle::Neox, .qkv_bias = true,
     .experts = Experts::Required, .shared_expert = true},
    {.name = "qwen3moe", .arch = Arch::Qwen3Moe, .rope_style = RopeStyle::Neox, .qk_norm = true,
     .experts = Experts::Required, .expert_weights_norm = true},
    {.name = "olmoe", .arch = Arch::OlMoe, .rope_style = RopeStyle::Neox, .qk_norm = true, .qk_norm_whole = true,
     .experts = Experts::Required},
};

}  // namespace

std::string_view supported_architectures() {
  // Mixtral-style mixtures of experts are llama files with expert tensors.
  return "llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen2moe, qwen3moe, olmoe";
}

Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::load(const std::string& path) {
  auto file = GgufFile::open(path);
  if (!file) return file.status();
  auto model = from_gguf(std::move(file.value()));
  if (!model) return Status::Error(path + ": " + model.error());
  return model;
}

namespace {

// Reads "<arch>.<suffix>" as a positive integer.
Status read_int(const GgufFile& f, const std::string& arch, const char* suffix, int* out,
                bool required, int64_t max = 1 << 24) {
  std::string key = arch + "." + suffix;
  auto v = f.get_int(key);
  if (!v) {
    if (required) return Status::Error("missing metadata key " + key);
    return Status::Ok();
  }
  if (*v <= 0 || *v > max) {
    return Status::Error("metadata " + key + " = " + std::to_string(*v) + " is out of range (1.." +
                         std::to_string(max) + ")");
  }
  *out = static_cast<int>(*v);
  return Status::Ok();
}

Status bind_weight(const GgufFile& f, const std::string& name, int64_t cols, int64_t rows, Weight* w,
            bool required = true) {
  const GgufTensorInfo* t = f.find_tensor(name);
  if (!t) return required ? Status::Error("missing tensor " + name) : Status::Ok();
  auto tr = ggml_type_traits(static_cast<uint32_t>(t->type));
  if (!tr || !tr->supported) {
    return Status::Error("tensor " + name + " has type " + std::string(ggml_type_name(t->type)) +
                         ", which is not supported (supported: " +
                         std::string(supported_ggml_types()) + ")");
  }
  uint64_t got_rows = t->ne[1] * t->ne[2] * t->ne[3];
  if (static_cast<int64_t>(t->ne[0]) != cols || static_cast<int64_t>(got_rows) != rows) {
    return Status::Error("tensor " + name + " has shape " + t->shape_string() + ", expected [" +
                         std::to_string(cols) + (rows > 1 ? ", " + std::to_string(rows) : "") + "]");
  }
  *w = Weight{t->data, nullptr, t->type, rows, cols};
  return Status::Ok();
}

// The softcaps, sliding window and attention scale: metadata where the file has it, else the family's.
Status read_family_traits(const GgufFile& f, const ArchTraits& t, ModelConfig& c) {
  const std::string& a = c.arch_name;
  if (t.gemma_embedding) c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
  c.attn_softcap = t.attn_softcap;
  c.final_softcap = t.final_softcap;
  if (auto v = f.get_float(a + ".attn_logit_softcapping")) c.attn_softcap = static_cast<float>(*v);
  if (auto v = f.get_float(a + ".final_logit_softcapping")) c.final_softcap = static_cast<float>(*v);
  if (!(c.attn_softcap >= 0) || !(c.final_softcap >= 0)) return Status::Error("logit soft-capping must not be negative");
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (c.n_layer == t.n_layer_embd_scaled_queries) c.attn_scale = 1.0f / std::sqrt(float(c.n_embd / c.n_head));
  if (auto v = f.get_float(a + ".attention.scale")) c.attn_scale = static_cast<float>(*v);
  if (!(c.attn_scale > 0)) return Status::Error("attention.scale must be positive");
  if (t.swa_period > 0) {
    if (auto s = read_int(f, a, "attention.sliding_window", &c.sliding_window, true, 1 << 24); !s) return s;
    int period = t.swa_period;
    if (auto s = read_int(f, a, "attention.sliding_window_pattern", &period, false, 4096); !s) return s;
    c.swa_layer.resize(c.n_layer);
    for (int l = 0; l < c.n_layer; ++l) c.swa_layer[l] = l % period < period - 1;
    c.rope_base_swa = t.rope_base_swa;
  }
  if (t.swa_every_layer) {
    // Phi-4's converter writes sliding_window = 0 (no window). Files of older converters have no key:
    // llama.cpp's default for Phi-3-mini/medium-4k then applies (their HF configs' 2047).
    auto w = f.get_int(a + ".attention.sliding_window");
    if (!w && c.n_ctx_train == 4096 && (c.n_layer == 32 || c.n_layer == 40)) w = 2047;
    if (w && (*w < 0 || *w > (1 << 24))) return Status::Error(a + ".attention.sliding_window is out of range");
    if (w && *w > 0) {
      c.sliding_window = static_cast<int>(*w);
      c.swa_layer.assign(c.n_layer, 1);
    }
  }
  return Status::Ok();
}

// Expert counts and routing of a mixture-of-experts family (or of a llama file that has experts).
Status read_experts(const GgufFile& f, const ArchTraits& t, ModelConfig& c) {
  const std::string& a = c.arch_name;
  if (t.experts == Experts::None) return Status::Ok();
  if (auto s = read_int(f, a, "expert_count", &c.n_expert, t.experts == Experts::Required, 4096); !s) return s;
  if (c.n_expert == 0) return Status::Ok();
  if (auto s = read_int(f, a, "expert_used_count", &c.n_expert_used, true, 4096); !s) return s;
  if (c.n_expert_used > c.n_expert) {
    return Status::Error(a + ".expert_used_count " + std::to_string(c.n_expert_used) + " exceeds expert_count " +
                         std::to_string(c.n_expert));
  }
  // Without the key: llama.cpp's fallbacks (qwen2moe n_ff / n_expert_used; the others n_ff, as Mixtral
  // and OLMoE files write the experts' width as feed_forward_length).
  c.n_ff_exp = t.shared_expert ? c.n_ff / c.n_expert_used : c.n_ff;
  if (auto s = read_int(f, a, "expert_feed_forward_length", &c.n_ff_exp, false); !s) return s;
  if (c.n_ff_exp <= 0) return Status::Error("the experts' feed-forward width is 0");
  if (t.shared_expert) {
    c.n_ff_shexp = c.n_ff;
    if (auto s = read_int(f, a, "expert_shared_feed_forward_length", &c.n_ff_shexp, false); !s) return s;
  }
  c.expert_weights_norm = t.expert_weights_norm;
  if (auto v = f.get_bool(a + ".expert_weights_norm")) c.expert_weights_norm = *v;
  // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE: 1 softmax (every family here), 2 sigmoid (DeepSeek-V3).
  if (auto g = f.get_int(a + ".expert_gating_func"); g && *g != 1) {
    return Status::Error(a + ".expert_gating_func = " + std::to_string(*g) +
                         " is not supported (supported: 1, softmax)");
  }
  return Status::Ok();
}

// One matrix per expert: views into a stacked [cols, rows, n_expert] tensor.
Status bind_experts(const GgufFile& f, const std::string& name, int64_t cols, int64_t rows, int n_expert,
                    std::vector<Weight>* out) {
  const GgufTensorInfo* t = f.find_tensor(name);
  if (!t) return Status::Error("missing tensor " + name);
  if (t->n_dims != 3 || int64_t(t->ne[0]) != cols || int64_t(t->ne[1]) != rows || int64_t(t->ne[2]) != n_expert) {
    return Status::Error("tensor " + name + " has shape " + t->shape_string() + ", expected [" + std::to_string(cols) +
                         ", " + std::to_string(rows) + ", " + std::to_string(n_expert) + "]");
  }
  Weight all;
  if (auto s = bind_weight(f, name, cols, rows * n_expert, &all); !s) return s;
  out->clear();
  for (int e = 0; e < n_expert; ++e) out->push_back(all.slice(int64_t(e) * rows, rows));
  return Status::Ok();
}

// A rope_factors_{long,short} tensor: n_rot / 2 F32 divisors.
Status read_rope_factors(const GgufFile& f, const char* name, int n_rot, std::vector<float>* out) {
  const GgufTensorInfo* t = f.find_tensor(name);
  if (!t) return Status::Error(std::string("missing tensor ") + name + " (LongRoPE files have both factor sets)");
  if (t->type != GgmlType::F32 || t->n_elements() != static_cast<uint64_t>(n_rot / 2)) {
    return Status::Error(std::string(name) + " must be F32 with rope.dimension_count/2 = " + std::to_string(n_rot / 2) +
                         " elements, got " + t->shape_string());
  }
  out->resize(n_rot / 2);
  std::memcpy(out->data(), t->data, out->size() * sizeof(float));
  for (float x : *out) {
    if (!(x > 0)) return Status::Error(std::string(name) + " holds a factor that is not positive");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Model>> Model::from_gguf(std::shared_ptr<GgufFile> file) {
  std::unique_ptr<Model> m(new Model());
  m->file_ = std::move(file);
  const GgufFile& f = *m->file_;
  ModelConfig& c = m->config_;

  auto arch = f.get_string("general.architecture");
  if (!arch) return Status::Error("missing metadata key general.architecture");
  c.arch_name = std::string(*arch);
  const ArchTraits* traits = nullptr;
  for (const ArchTraits& t : kArchitectures) {
    if (c.arch_name == t.name) traits = &t;
  }
  if (!traits) {
    return Status::Error("unsupported architecture '" + c.arch_name +
                         "' (supported: " + std::string(supported_architectures()) + ")");
  }
  c.arch = traits->arch;
  c.rope_style = traits->rope_style;
  c.qkv_bias = traits->qkv_bias;
  c.qk_norm = traits->qk_norm;
  c.qk_norm_whole = traits->qk_norm_whole;
  c.post_norms = traits->post_norms;
  if (traits->gemma_embedding) c.ffn_gate = FfnGate::GeluTanh;
  if (auto n = f.get_string("general.name")) c.name = std::string(*n);
  const std::string& a = c.arch_name;

  if (auto s = read_int(f, a, "embedding_length", &c.n_embd, true); !s) return s;
  if (auto s = read_int(f, a, "block_count", &c.n_layer, true, 4096); !s) return s;
  if (auto s = read_int(f, a, "feed_forward_length", &c.n_ff, true); !s) return s;
  if (auto s = read_int(f, a, "attention.head_count", &c.n_head, true, 4096); !s) return s;
  c.n_head_kv = c.n_head;
  if (auto s = read_int(f, a, "attention.head_count_kv", &c.n_head_kv, false, 4096); !s) return s;
  c.n_ctx_train = 2048;
  if (auto s = read_int(f, a, "context_length", &c.n_ctx_train, false, 1 << 24); !s) return s;
  if (c.n_head % c.n_head_kv != 0) {
    return Status::Error("head_count " + std::to_string(c.n_head) +
                         " is not a multiple of head_count_kv " + std::to_string(c.n_head_kv));
  }
  // The head size is n_embd / n_head unless the file says otherwise (gemma: 256 on a 2304-wide model).
  if (auto s = read_int(f, a, "attention.key_length", &c.head_dim, false, 4096); !s) return s;
  if (c.head_dim == 0) {
    if (c.n_embd % c.n_head != 0) {
      return Status::Error("embedding_length " + std::to_string(c.n_embd) +
                           " is not divisible by head_count " + std::to_string(c.n_head));
    }
    c.head_dim = c.n_embd / c.n_head;
  }
  if (c.head_dim > 512) {
    return Status::Error("head size " + std::to_string(c.head_dim) + " is larger than the supported 512");
  }
  int v_len = c.head_dim;
  if (auto s = read_int(f, a, "attention.value_length", &v_len, false, 4096); !s) return s;
  if (v_len != c.head_dim) return Status::Error("attention.value_length != key_length is not supported");
  c.n_rot = c.head_dim;
  if (auto s = read_int(f, a, "rope.dimension_count", &c.n_rot, false, 4096); !s) return s;
  if (c.n_rot > c.head_dim || c.n_rot % 2 != 0) {
    return Status::Error("rope.dimension_count " + std::to_string(c.n_rot) +
                         " must be even and at most the head size " + std::to_string(c.head_dim));
  }
  if (auto v = f.get_float(a + ".rope.freq_base")) c.rope_base = static_cast<float>(*v);
  if (auto v = f.get_float(a + ".attention.layer_norm_rms_epsilon")) c.norm_eps = static_cast<float>(*v);
  if (!(c.rope_base > 0) || !(c.norm_eps > 0)) return Status::Error("rope.freq_base and rms epsilon must be positive");
  if (auto s = read_family_traits(f, *traits, c); !s) return s;
  if (auto s = read_experts(f, *traits, c); !s) return s;
  if (auto v = f.get_float(a + ".rope.scaling.attn_factor")) c.rope_attn_factor = static_cast<float>(*v);
  if (!(c.rope_attn_factor > 0)) return Status::Error("rope.scaling.attn_factor must be positive");
  if (auto type = f.get_string(a + ".rope.scaling.type")) {
    if (*type == "linear") {
      auto factor = f.get_float(a + ".rope.scaling.factor");
      if (factor && *factor > 0) c.rope_scale = static_cast<float>(*factor);
    } else if (*type != "none" && *type != "llama3") {
      return Status::Error("unsupported rope.scaling.type '" + std::string(*type) +
                           "' (supported: none, linear, llama3)");
    }
  }

  auto tok = Tokenizer::from_gguf(f);
  if (!tok) return tok.status();
  m->tokenizer_ = std::move(tok.value());
  c.n_vocab = m->tokenizer_->n_vocab();

  const int64_t d = c.n_embd, q = c.q_dim(), kv = c.kv_dim(), ff = c.n_ff;
  if (auto s = bind_weight(f, "token_embd.weight", d, c.n_vocab, &m->tok_embd); !s) return s;
  if (auto s = bind_weight(f, "output_norm.weight", d, 1, &m->output_norm); !s) return s;
  if (auto s = bind_weight(f, "output.weight", d, c.n_vocab, &m->output, false); !s) return s;
  c.tied_embeddings = !m->output;
  if (c.tied_embeddings) m->output = m->tok_embd;
  if (m->output_norm.type != GgmlType::F32) return Status::Error("output_norm.weight must be F32");

  if (const GgufTensorInfo* rf = f.find_tensor("rope_freqs.weight")) {
    if (rf->type != GgmlType::F32 || rf->n_elements() != static_cast<uint64_t>(c.n_rot / 2)) {
      return Status::Error("rope_freqs.weight must be F32 with rope.dimension_count/2 = " +
                           std::to_string(c.n_rot / 2) + " elements, got " + rf->shape_string());
    }
    c.rope_freq_factors.resize(c.n_rot / 2);
    std::memcpy(c.rope_freq_factors.data(), rf->data, c.rope_freq_factors.size() * sizeof(float));
  } else if (f.find_tensor("rope_factors_long.weight") || f.find_tensor("rope_factors_short.weight")) {
    // LongRoPE (phi3): the long factors when the context towerd serves (n_ctx_train) is longer than the
    // original one, as llama.cpp picks them for its context size (docs/models.md, "Phi-3").
    if (auto s = read_int(f, a, "rope.scaling.original_context_length", &c.rope_ctx_orig, true); !s) return s;
    const bool long_ctx = c.n_ctx_train > c.rope_ctx_orig;
    if (auto s = read_rope_factors(f, "rope_factors_long.weight", c.n_rot, &c.rope_freq_factors); !s) return s;
    std::vector<float> short_factors;
    if (auto s = read_rope_factors(f, "rope_factors_short.weight", c.n_rot, &short_factors); !s) return s;
    if (!long_ctx) c.rope_freq_factors = std::move(short_factors);
  }

  m->layers.resize(c.n_layer);
  for (int l = 0; l < c.n_layer; ++l) {
    LayerWeights& L = m->layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    Status s;
    if (!(s = bind_weight(f, p + "attn_norm.weight", d, 1, &L.attn_norm))) return s;
    if (f.find_tensor(p + "attn_qkv.weight")) {  // phi3: q, k and v stacked in one matrix
      Weight qkv;
      if (!(s = bind_weight(f, p + "attn_qkv.weight", d, q + 2 * kv, &qkv))) return s;
      L.wq = qkv.slice(0, q), L.wk = qkv.slice(q, kv), L.wv = qkv.slice(q + kv, kv);
    } else {
      if (!(s = bind_weight(f, p + "attn_q.weight", d, q, &L.wq))) return s;
      if (!(s = bind_weight(f, p + "attn_k.weight", d, kv, &L.wk))) return s;
      if (!(s = bind_weight(f, p + "attn_v.weight", d, kv, &L.wv))) return s;
    }
    if (!(s = bind_weight(f, p + "attn_output.weight", q, d, &L.wo))) return s;
    if (!(s = bind_weight(f, p + "ffn_norm.weight", d, 1, &L.ffn_norm))) return s;
    if (c.is_moe()) {
      const int64_t fe = c.n_ff_exp, ne = c.n_expert;
      if (!(s = bind_weight(f, p + "ffn_gate_inp.weight", d, ne, &L.gate_inp))) return s;
      if (!(s = bind_experts(f, p + "ffn_gate_exps.weight", d, fe, c.n_expert, &L.gate_exps))) return s;
      if (!(s = bind_experts(f, p + "ffn_up_exps.weight", d, fe, c.n_expert, &L.up_exps))) return s;
      if (!(s = bind_experts(f, p + "ffn_down_exps.weight", fe, d, c.n_expert, &L.down_exps))) return s;
      if (traits->shared_expert) {
        const int64_t fs = c.n_ff_shexp;
        if (!(s = bind_weight(f, p + "ffn_gate_inp_shexp.weight", d, 1, &L.gate_inp_shexp))) return s;
        if (!(s = bind_weight(f, p + "ffn_gate_shexp.weight", d, fs, &L.gate_shexp))) return s;
        if (!(s = bind_weight(f, p + "ffn_up_shexp.weight", d, fs, &L.up_shexp))) return s;
        if (!(s = bind_weight(f, p + "ffn_down_shexp.weight", fs, d, &L.down_shexp))) return s;
      }
    } else if (traits->fused_ffn_up) {
      Weight gate_up;
      if (!(s = bind_weight(f, p + "ffn_up.weight", d, 2 * ff, &gate_up))) return s;
      L.w_gate = gate_up.slice(0, ff), L.w_up = gate_up.slice(ff, ff);
      if (!(s = bind_weight(f, p + "ffn_down.weight", ff, d, &L.w_down))) return s;
    } else {
      if (!(s = bind_weight(f, p + "ffn_gate.weight", d, ff, &L.w_gate))) return s;
      if (!(s = bind_weight(f, p + "ffn_up.weight", d, ff, &L.w_up))) return s;
      if (!(s = bind_weight(f, p + "ffn_down.weight", ff, d, &L.w_down))) return s;
    }
    if (c.qkv_bias) {
      if (!(s = bind_weight(f, p + "attn_q.bias", q, 1, &L.bq))) return s;
      if (!(s = bind_weight(f, p + "attn_k.bias", kv, 1, &L.bk))) return s;
      if (!(s = bind_weight(f, p + "attn_v.bias", kv, 1, &L.bv))) return s;
    }
    if (c.qk_norm) {
      const int64_t qn = c.qk_norm_whole ? q : c.head_dim, kn = c.qk_norm_whole ? kv : c.head_dim;
      if (!(s = bind_weight(f, p + "attn_q_norm.weight", qn, 1, &L.q_norm))) return s;
      if (!(s = bind_weight(f, p + "attn_k_norm.weight", kn, 1, &L.k_norm))) return s;
    }
    if (c.post_norms) {
      if (!(s = bind_weight(f, p + "post_attention_norm.weight", d, 1, &L.post_attn_norm))) return s;
      if (!(s = bind_weight(f, p + "post_ffw_norm.weight", d, 1, &L.post_ffn_norm))) return s;
    }
    for (const Weight* v : {&L.attn_norm, &L.ffn_norm, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm, &L.post_attn_norm,
                            &L.post_ffn_norm, &L.gate_inp_shexp}) {
      if (*v && v->type != GgmlType::F32) {
        return Status::Error("layer " + std::to_string(l) + ": norm weights and biases must be F32");
      }
    }
  }
  m->pack_weights();
  return m;
}

// Interleaved copies of the matrices the fast kernels read (each matrix once, even when shared).
void Model::pack_weights() {
  std::vector<Weight*> ws = {&output};
  for (LayerWeights& L : layers) for_each_matrix(L, [&](Weight& w) { ws.push_back(&w); });
  auto packed_size = [](const Weight& w) -> size_t {
    const auto t = static_cast<uint32_t>(w.type);
    const size_t groups = static_cast<size_t>(w.rows) / simd::kPackRows;
    if (!w || !simd::has_packed(t) || groups == 0 || w.cols % 32 != 0) return 0;
    return groups * simd::packed_group_bytes(t, static_cast<size_t>(w.cols));
  };
  constexpr size_t kAlign = 64;
  size_t total = 0;
  for (const Weight* w : ws) total += (packed_size(*w) + kAlign - 1) / kAlign * kAlign;
  if (total == 0) return;
  packed_store_ = HugeBuffer(total);
  uint8_t* p = packed_store_.data();
  // Work in slices of row groups, so that one large matrix (the output, often Q6_K) does not leave
  // the other threads idle. Groups are packed independently: the bytes do not depend on who packs them.
  struct Slice {
    const Weight* w;
    size_t group0, groups;
    uint8_t* out;  // of the whole matrix
  };
  constexpr size_t kGroupsPerSlice = 256;
  std::vector<Slice> slices;
  for (Weight* w : ws) {
    const size_t bytes = packed_size(*w);
    if (bytes == 0) continue;
    w->packed = p;
    packed_bytes_ += bytes;
    const size_t groups = bytes / simd::packed_group_bytes(static_cast<uint32_t>(w->type), static_cast<size_t>(w->cols));
    for (size_t g = 0; g < groups; g += kGroupsPerSlice) slices.push_back({w, g, std::min(kGroupsPerSlice, groups - g), p});
    p += (bytes + kAlign - 1) / kAlign * kAlign;
  }
  // Packing reads the whole file once and is most of a large model's load time: every core helps.
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < slices.size(); i = next++) {
      const Slice& sl = slices[i];
      const auto t = static_cast<uint32_t>(sl.w->type);
      const size_t cols = static_cast<size_t>(sl.w->cols);
      const size_t group_bytes = simd::packed_group_bytes(t, cols);
      simd::pack_rows(t, sl.w->data + sl.group0 * simd::kPackRows * sl.w->row_stride(), sl.w->row_stride(), sl.groups,
                      cols, sl.out + sl.group0 * group_bytes);
    }
  };
  const size_t n_threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16);
  std::vector<std::thread> threads;
  for (size_t i = 1; i < std::min(n_threads, slices.size()); ++i) threads.emplace_back(work);
  work();
  for (auto& th : threads) th.join();
  if (config_.tied_embeddings) tok_embd.packed = output.packed;
  release_packed_sources();
}

size_t Model::release_packed_sources() const {
  if (!file_->mapped()) return 0;  // from_memory: the caller's buffer, never ours to discard
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  std::vector<const Weight*> ws = {&output};
  for (const LayerWeights& L : layers) for_each_matrix(L, [&](const Weight& w) { ws.push_back(&w); });
  size_t released = 0;
  for (const Weight* w : ws) {
    // A tied output matrix is also the embedding table, whose rows the fast path reads.
    if (!w->packed || (w == &output && config_.tied_embeddings)) continue;
    const size_t rows = static_cast<size_t>(w->rows) / simd::kPackRows * simd::kPackRows;  // packed rows
    const auto begin = reinterpret_cast<uintptr_t>(w->data);
    const uintptr_t end = begin + rows * w->row_stride();
    const uintptr_t b = (begin + page - 1) / page * page, e = end / page * page;  // pages wholly inside
    if (e > b && madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED) == 0) released += e - b;
  }
  return released;
}

}  // namespace towers

namespace towers {

namespace {
// A matrix's copy: per group of a row one f32 scale, then its s8 rows, or with whole-row scales
// (`pack`) oneDNN's packed slices when it has a layout for them (64-aligned after the scales).
size_t int8_scale_bytes(const Weight& w, size_t group) {
  const size_t rows = static_cast<size_t>(w.rows), cols = static_cast<size_t>(w.cols);
  return (rows * (cols / (group ? group : cols)) * sizeof(float) + 63) / 64 * 64;
}
size_t int8_packed_bytes(const Weight& w, size_t group, bool pack) {
  const size_t cols = static_cast<size_t>(w.cols);
  return pack && (group == 0 || group == cols) ? simd::onednn_packed_bytes(static_cast<size_t>(w.rows), cols) : 0;
}
size_t int8_bytes_of(const Weight& w, size_t group, bool pack) {
  const size_t packed = int8_packed_bytes(w, group, pack);
  return int8_scale_bytes(w, group) + (packed ? packed : static_cast<size_t>(w.rows) * static_cast<size_t>(w.cols));
}
}  // namespace

// The matrices build_int8_copies copies: each dense layer matrix whose rows split into whole groups, of
// a quantized type of fewer than 6.5 bits per weight (Q2_K .. Q5_1, Q5_K, IQ4_*). Not Q6_K or Q8_0:
// their 7-bit copies would lose more than the file's own quantization (test_onednn measures it);
// f32/f16/bf16 stay exact. Such matrices keep the fast kernels in a oneDNN step.
std::vector<Weight*> Model::int8_matrices() {
  auto worth_it = [](GgmlType t) {
    return simd::has_quant_dot(static_cast<uint32_t>(t)) && row_bytes(t, 256) * 8 < static_cast<size_t>(6.5 * 256);
  };
  std::vector<Weight*> ws;
  for (LayerWeights& L : layers) {
    for (Weight* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) {
      if (*w && worth_it(w->type) && w->cols % 256 == 0) {
        ws.push_back(w);
      }
    }
  }
  return ws;
}

size_t Model::int8_copy_bytes_needed() const {
  size_t total = 0;
  for (const Weight* w : const_cast<Model*>(this)->int8_matrices()) {
    total += int8_bytes_of(*w, kInt8Group, true);
  }
  return total;
}

Status Model::build_int8_copies(ThreadPool& pool, size_t group, bool pack) {
  if (int8_bytes_ > 0) return Status::Ok();
  if (!simd::onednn_available()) return Status::Error(std::string("int8 prefill copies: ") + simd::onednn_describe());
  if (group != 0 && group % 256 != 0) return Status::Error("int8 prefill copies: group must be 0 or a multiple of 256");
  const std::vector<Weight*> ws = int8_matrices();
  size_t total = 0;
  for (const Weight* w : ws) {
    if (group != 0 && w->cols % static_cast<int64_t>(group) != 0) {
      return Status::Error("int8 prefill copies: a row of " + std::to_string(w->cols) + " does not split into groups of " +
                           std::to_string(group));
    }
    total += int8_bytes_of(*w, group, pack);
  }
  if (total == 0) return Status::Ok();
  int8_store_ = HugeBuffer(total);
  uint8_t* p = int8_store_.data();
  std::vector<std::vector<float>> rowbuf(static_cast<size_t>(pool.size()));
  std::vector<int8_t> plain;  // a matrix's s8 rows before packing
  bool packed_all = true;
  for (Weight* w : ws) {
    const size_t rows = static_cast<size_t>(w->rows), cols = static_cast<size_t>(w->cols);
    const size_t g = group ? group : cols;
    const size_t packed_bytes = int8_packed_bytes(*w, group, pack);
    auto* scales = reinterpret_cast<float*>(p);
    uint8_t* body = p + int8_scale_bytes(*w, group);
    int8_t* q = reinterpret_cast<int8_t*>(body);
    if (packed_bytes) {
      plain.resize(rows * cols);
      q = plain.data();
    }
    // Rows are quantized independently: the bytes do not depend on the threads.
    pool.parallel_for(rows, [&](size_t r0, size_t r1, int thread) {
      std::vector<float>& f = rowbuf[static_cast<size_t>(thread)];
      f.resize(cols);
      for (size_t r = r0; r < r1; ++r) {
        dequantize_row(w->type, w->row(static_cast<int64_t>(r)), f.data(), cols);
        simd::onednn_quantize_weights(f.data(), q + r * cols, scales + r * (cols / g), cols, g);
      }
    });
    if (packed_bytes) {
      if (!simd::onednn_pack_weights(plain.data(), rows, cols, body)) {
        for (Weight* done : ws) done->s8 = nullptr, done->s8_packed = nullptr, done->s8_scales = nullptr;
        int8_store_ = HugeBuffer();
        return Status::Error("int8 prefill copies: oneDNN could not pack a " + std::to_string(rows) + " x " +
                             std::to_string(cols) + " matrix");
      }
      w->s8_packed = body;
    } else {
      w->s8 = q;
      packed_all = false;
    }
    w->s8_scales = scales;
    w->s8_group = static_cast<int64_t>(g);
    p += int8_bytes_of(*w, group, pack);
  }
  int8_bytes_ = total;
  int8_packed_ = packed_all;
  return Status::Ok();
}

}  // namespace towers
