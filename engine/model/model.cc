#include "engine/model/model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "engine/text/tokenizer.h"
#include "simd/quant_dot.h"

namespace towers {

namespace {

// Everything an architecture changes in the forward pass, in one row. Metadata read below
// (softcaps, window, attention scale) overrides these defaults where the file has it.
struct ArchTraits {
  const char* name;
  Arch arch;
  RopeStyle rope_style;
  bool qkv_bias, qk_norm, post_norms;
  bool gemma_embedding;   // embeddings scaled by sqrt(n_embd), GeGLU feed-forward
  int swa_period;         // 0: no window; P: layer l is windowed unless l % P == P - 1 (llama.cpp's swa pattern)
  float rope_base_swa;    // windowed layers' RoPE base (gemma3: 10000, HF's rope_local_base_freq); 0: shared
  float attn_softcap, final_softcap;  // defaults when the file has no *_logit_softcapping keys
  // Layer count of the one size whose score scale is 1/sqrt(n_embd/n_head) instead of 1/sqrt(head_dim)
  // (the 27B models: HF's query_pre_attn_scalar; llama.cpp recognises them the same way).
  int n_layer_embd_scaled_queries;
};

constexpr ArchTraits kArchitectures[] = {
    {"llama", Arch::Llama, RopeStyle::Normal, false, false, false, false, 0, 0, 0, 0, 0},
    {"qwen2", Arch::Qwen2, RopeStyle::Neox, true, false, false, false, 0, 0, 0, 0, 0},
    {"qwen3", Arch::Qwen3, RopeStyle::Neox, false, true, false, false, 0, 0, 0, 0, 0},
    {"gemma2", Arch::Gemma2, RopeStyle::Neox, false, false, true, true, 2, 0, 50.0f, 30.0f, 46},
    {"gemma3", Arch::Gemma3, RopeStyle::Neox, false, true, true, true, 6, 10000.0f, 0, 0, 62},
};

}  // namespace

std::string_view supported_architectures() { return "llama, qwen2, qwen3, gemma2, gemma3"; }

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
  }

  m->layers.resize(c.n_layer);
  for (int l = 0; l < c.n_layer; ++l) {
    LayerWeights& L = m->layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    Status s;
    if (!(s = bind_weight(f, p + "attn_norm.weight", d, 1, &L.attn_norm))) return s;
    if (!(s = bind_weight(f, p + "attn_q.weight", d, q, &L.wq))) return s;
    if (!(s = bind_weight(f, p + "attn_k.weight", d, kv, &L.wk))) return s;
    if (!(s = bind_weight(f, p + "attn_v.weight", d, kv, &L.wv))) return s;
    if (!(s = bind_weight(f, p + "attn_output.weight", q, d, &L.wo))) return s;
    if (!(s = bind_weight(f, p + "ffn_norm.weight", d, 1, &L.ffn_norm))) return s;
    if (!(s = bind_weight(f, p + "ffn_gate.weight", d, ff, &L.w_gate))) return s;
    if (!(s = bind_weight(f, p + "ffn_up.weight", d, ff, &L.w_up))) return s;
    if (!(s = bind_weight(f, p + "ffn_down.weight", ff, d, &L.w_down))) return s;
    if (c.qkv_bias) {
      if (!(s = bind_weight(f, p + "attn_q.bias", q, 1, &L.bq))) return s;
      if (!(s = bind_weight(f, p + "attn_k.bias", kv, 1, &L.bk))) return s;
      if (!(s = bind_weight(f, p + "attn_v.bias", kv, 1, &L.bv))) return s;
    }
    if (c.qk_norm) {
      if (!(s = bind_weight(f, p + "attn_q_norm.weight", c.head_dim, 1, &L.q_norm))) return s;
      if (!(s = bind_weight(f, p + "attn_k_norm.weight", c.head_dim, 1, &L.k_norm))) return s;
    }
    if (c.post_norms) {
      if (!(s = bind_weight(f, p + "post_attention_norm.weight", d, 1, &L.post_attn_norm))) return s;
      if (!(s = bind_weight(f, p + "post_ffw_norm.weight", d, 1, &L.post_ffn_norm))) return s;
    }
    for (const Weight* v : {&L.attn_norm, &L.ffn_norm, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm, &L.post_attn_norm,
                            &L.post_ffn_norm}) {
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
  for (LayerWeights& L : layers) {
    for (Weight* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) ws.push_back(w);
  }
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
  for (const LayerWeights& L : layers) {
    for (const Weight* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) ws.push_back(w);
  }
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
