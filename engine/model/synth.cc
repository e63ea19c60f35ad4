#include "engine/model/synth.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include "engine/gguf/gguf.h"
#include "engine/gguf/quant.h"
#include "engine/base/thread_pool.h"
#include "engine/text/vocab_import.h"

namespace towers {

const std::vector<SynthShape>& synth_shapes() {
  static const std::vector<SynthShape> shapes = {
      {"llama3.2-1b", "llama", 2048, 16, 32, 8, 8192, 128256, 131072, 500000.0f, true, 32.0f, "llama3"},
      {"llama3.1-8b", "llama", 4096, 32, 32, 8, 14336, 128256, 131072, 500000.0f, false, 8.0f, "llama3"},
      // A small coder of Llama-3.2's vocabulary (the design's distilled coder M~ for the cold tier's
      // codec: its shape, random weights): what decoding a session at rest costs with one (bench_capacity).
      {"llama3.2-coder", "llama", 256, 2, 4, 2, 768, 128256, 131072, 500000.0f, true, 32.0f, "llama3"},
      {"qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 4864, 151936, 32768, 1000000.0f, true, 0.0f, "qwen2"},
      {"tiny", "llama", 256, 4, 8, 4, 768, 1024, 2048, 10000.0f, false, 0.0f, "generated"},
      // Small enough for unit tests of the qwen2 path (biases, neox RoPE, tied embeddings).
      {"tiny-qwen2", "qwen2", 128, 2, 4, 2, 256, 1024, 2048, 1000000.0f, true, 0.0f, "generated"},
      // Real shapes of the newer families (bench: towerctl model synth).
      {"qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 3072, 151936, 40960, 1000000.0f, true, 0.0f, "qwen2", 128},
      {"qwen3-8b", "qwen3", 4096, 36, 32, 8, 12288, 151936, 40960, 1000000.0f, false, 0.0f, "qwen2", 128},
      {"gemma2-2b", "gemma2", 2304, 26, 8, 4, 9216, 256000, 8192, 10000.0f, true, 0.0f, "generated", 256, 4096,
       50.0f, 30.0f},
      {"gemma3-1b", "gemma3", 1152, 26, 4, 1, 6912, 262144, 32768, 1000000.0f, true, 0.0f, "generated", 256, 512},
      {"gemma3-4b", "gemma3", 2560, 34, 8, 4, 10240, 262144, 131072, 1000000.0f, true, 0.0f, "generated", 256, 1024,
       0.0f, 0.0f, 8.0f},
      // The architecture reference tests' models (tests/reference/arch/): head size != n_embd / n_head, a
      // window shorter than the test's prompt, caps the tiny model's scores and logits actually reach.
      {"tiny-qwen3", "qwen3", 64, 2, 4, 2, 128, 512, 2048, 1000000.0f, false, 0.0f, "generated", 32, 0, 0, 0, 0,
       0.2f, 0.5f},
      {"tiny-gemma2", "gemma2", 64, 4, 4, 2, 128, 512, 2048, 10000.0f, true, 0.0f, "generated", 32, 5, 2.0f, 3.0f, 0,
       0.2f, 0.5f},
      {"tiny-gemma3", "gemma3", 64, 6, 4, 2, 128, 512, 2048, 1000000.0f, true, 0.0f, "generated", 32, 5, 0, 0, 8.0f,
       0.2f, 0.5f},
      // The attention tile tests' (tests/test_arch.cc): gemma3's five windowed layers and one global one, with
      // a window longer than a tile and than an attention block, so that it cuts some tiles and not others.
      {"tiny-gemma3-w200", "gemma3", 64, 6, 4, 2, 128, 512, 2048, 1000000.0f, true, 0.0f, "generated", 32, 200, 0, 0,
       0, 0.2f, 0.5f},
      // Phi-3 and the mixtures of experts: real shapes (bench) and the reference tests' tiny ones (8 experts,
      // 2 or 3 chosen, so that every token's routing differs; phi3 with a window of 5, LongRoPE whose
      // original context 16 is shorter than the test's sequences (so the long factors apply), and 12 of
      // its 16 head dimensions rotated, as Phi-4-mini rotates 96 of 128).
      {.name = "phi3-mini", .arch = "phi3", .n_embd = 3072, .n_layer = 32, .n_head = 32, .n_head_kv = 32, .n_ff = 8192,
       .n_vocab = 32064, .n_ctx = 131072, .rope_base = 10000.0f, .tied_embeddings = false, .llama3_rope_factor = 0,
       .tokenizer = "generated", .sliding_window = 262144, .rope_ctx_orig = 4096},
      {.name = "qwen3-30b-a3b", .arch = "qwen3moe", .n_embd = 2048, .n_layer = 48, .n_head = 32, .n_head_kv = 4,
       .n_ff = 6144, .n_vocab = 151936, .n_ctx = 40960, .rope_base = 1000000.0f, .tied_embeddings = false,
       .llama3_rope_factor = 0, .tokenizer = "qwen2", .head_dim = 128, .n_expert = 128, .n_expert_used = 8,
       .n_ff_exp = 768},
      {.name = "olmoe-1b-7b", .arch = "olmoe", .n_embd = 2048, .n_layer = 16, .n_head = 16, .n_head_kv = 16,
       .n_ff = 1024, .n_vocab = 50304, .n_ctx = 4096, .rope_base = 10000.0f, .tied_embeddings = false,
       .llama3_rope_factor = 0, .tokenizer = "generated", .n_expert = 64, .n_expert_used = 8, .n_ff_exp = 1024},
      {.name = "tiny-phi3", .arch = "phi3", .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
       .n_vocab = 512, .n_ctx = 2048, .rope_base = 10000.0f, .tied_embeddings = false, .llama3_rope_factor = 0,
       .tokenizer = "generated", .sliding_window = 5, .weight_std = 0.2f, .norm_jitter = 0.5f, .rope_ctx_orig = 16,
       .rope_dims = 12},
      {.name = "tiny-mixtral", .arch = "llama", .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 32,
       .n_vocab = 512, .n_ctx = 2048, .rope_base = 1000000.0f, .tied_embeddings = false, .llama3_rope_factor = 0,
       .tokenizer = "generated", .weight_std = 0.2f, .norm_jitter = 0.5f, .n_expert = 8, .n_expert_used = 2,
       .n_ff_exp = 32},
      {.name = "tiny-qwen2moe", .arch = "qwen2moe", .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
       .n_ff = 128, .n_vocab = 512, .n_ctx = 2048, .rope_base = 1000000.0f, .tied_embeddings = false,
       .llama3_rope_factor = 0, .tokenizer = "generated", .weight_std = 0.2f, .norm_jitter = 0.5f, .n_expert = 8,
       .n_expert_used = 3, .n_ff_exp = 32, .n_ff_shexp = 64},
      {.name = "tiny-qwen3moe", .arch = "qwen3moe", .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
       .n_ff = 128, .n_vocab = 512, .n_ctx = 2048, .rope_base = 1000000.0f, .tied_embeddings = false,
       .llama3_rope_factor = 0, .tokenizer = "generated", .head_dim = 32, .weight_std = 0.2f, .norm_jitter = 0.5f,
       .n_expert = 8, .n_expert_used = 3, .n_ff_exp = 32},
      {.name = "tiny-olmoe", .arch = "olmoe", .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 4, .n_ff = 32,
       .n_vocab = 512, .n_ctx = 4096, .rope_base = 10000.0f, .tied_embeddings = false, .llama3_rope_factor = 0,
       .tokenizer = "generated", .weight_std = 0.2f, .norm_jitter = 0.5f, .n_expert = 8, .n_expert_used = 2,
       .n_ff_exp = 32},
      // The KL-divergence references' (tests/reference/kld/, made by llama.cpp): a llama 256 wide, so that
      // every matrix holds whole 256-element super-blocks and the K and IQ4_XS types are used as such, with
      // weights large enough for peaked next-token distributions; gemma2 with 26 layers, the count
      // llama.cpp (c392e50) needs to know the model as Gemma 2 2B (it refuses other counts); tiny-phi3 with
      // every head dimension rotated (that llama.cpp wants LongRoPE factors for the whole head).
      {.name = "tiny-llama-256", .arch = "llama", .n_embd = 256, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
       .n_ff = 512, .n_vocab = 512, .n_ctx = 2048, .rope_base = 10000.0f, .tied_embeddings = false,
       .llama3_rope_factor = 0, .tokenizer = "generated", .weight_std = 0.1f, .norm_jitter = 0.5f},
      {.name = "tiny-gemma2-l26", .arch = "gemma2", .n_embd = 64, .n_layer = 26, .n_head = 4, .n_head_kv = 2,
       .n_ff = 128, .n_vocab = 512, .n_ctx = 2048, .rope_base = 10000.0f, .tied_embeddings = true,
       .llama3_rope_factor = 0, .tokenizer = "generated", .head_dim = 32, .sliding_window = 5,
       .attn_softcap = 2.0f, .final_softcap = 3.0f, .weight_std = 0.2f, .norm_jitter = 0.5f},
      {.name = "tiny-phi3-full-rope", .arch = "phi3", .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
       .n_ff = 128, .n_vocab = 512, .n_ctx = 2048, .rope_base = 10000.0f, .tied_embeddings = false,
       .llama3_rope_factor = 0, .tokenizer = "generated", .sliding_window = 5, .weight_std = 0.2f,
       .norm_jitter = 0.5f, .rope_ctx_orig = 16},
  };
  return shapes;
}

std::string synth_shape_names() {
  std::string s;
  for (const auto& sh : synth_shapes()) s += (s.empty() ? "" : ", ") + sh.name;
  return s;
}
namespace {

// A file type of llama.cpp's (its name in lower case, its llama_ftype id for general.file_type) and the
// tensor type of most of its matrices.
struct SynthFileType {
  std::string_view name;
  uint32_t ftype;
  GgmlType base;
};
constexpr SynthFileType kFileTypes[] = {
    {"f16", 1, GgmlType::F16},       {"q8_0", 7, GgmlType::Q8_0},     {"q4_0", 2, GgmlType::Q4_0},
    {"q5_1", 9, GgmlType::Q5_1},     {"q2_k", 10, GgmlType::Q2_K},    {"q3_k_m", 12, GgmlType::Q3_K},
    {"q4_k_m", 15, GgmlType::Q4_K},  {"q5_k_m", 17, GgmlType::Q5_K},  {"iq4_nl", 25, GgmlType::IQ4_NL},
    {"iq4_xs", 30, GgmlType::IQ4_XS},
};

const SynthFileType* find_file_type(const std::string& name) {
  for (const auto& f : kFileTypes) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

}  // namespace

std::string synth_type_names() {
  std::string s;
  for (const auto& f : kFileTypes) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

namespace {

// llama.cpp's layer choice for the extra bits of *_K_M files.
bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// Tensor type for a weight under a file type, following llama.cpp's llama_tensor_get_type (without
// an importance matrix; n_gqa = query heads per KV head).
GgmlType pick_type_for_blocks(const SynthFileType& f, const std::string& role, int layer, int n_layer,
                              int n_gqa, bool is_output) {
  const GgmlType base = f.base;
  if (base == GgmlType::F16 || base == GgmlType::Q8_0) return base;
  if (is_output) return GgmlType::Q6_K;
  const bool v = role == "attn_v", down = role == "ffn_down", out = role == "attn_output";
  switch (base) {
    case GgmlType::Q2_K:
      if (v) return n_gqa >= 4 ? GgmlType::Q4_K : GgmlType::Q3_K;
      return down || out ? GgmlType::Q3_K : base;
    case GgmlType::Q3_K:  // Q3_K_M
      if (v) return layer < 2 ? GgmlType::Q5_K : GgmlType::Q4_K;
      if (down) return layer < n_layer / 16 ? GgmlType::Q5_K : GgmlType::Q4_K;
      return out ? GgmlType::Q4_K : base;
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:  // Q4_K_M, Q5_K_M
      return (v || down) && use_more_bits(layer, n_layer) ? GgmlType::Q6_K : base;
    case GgmlType::IQ4_NL:
    case GgmlType::IQ4_XS:
      return (v && n_gqa >= 4) || (down && layer < n_layer / 8) ? GgmlType::Q5_K : base;
    default: return base;
  }
}

// Rows that are not whole 256-element super-blocks cannot hold the super-block types; llama.cpp then
// falls back to a 32-element type of similar size.
GgmlType pick_type(const SynthFileType& f, const std::string& role, int layer, const SynthShape& s,
                   bool is_output, int64_t cols) {
  GgmlType t = pick_type_for_blocks(f, role, layer, s.n_layer, s.n_head / s.n_head_kv, is_output);
  if (cols % 256 == 0) return t;
  switch (t) {
    case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::IQ4_XS: return GgmlType::IQ4_NL;
    case GgmlType::Q4_K: return GgmlType::Q5_0;
    case GgmlType::Q5_K: return GgmlType::Q5_1;
    case GgmlType::Q6_K: return GgmlType::Q8_0;
    default: return t;
  }
}

std::vector<float> llama3_rope_factors(const SynthShape& s) {
  const int dim = s.n_embd / s.n_head;
  const double factor = s.llama3_rope_factor, low = 1.0, high = 4.0, old_ctx = 8192.0;
  const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
  std::vector<float> out;
  for (int i = 0; i < dim; i += 2) {
    const double freq = std::pow(double(s.rope_base), -double(i) / dim);
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < high_wavelen) {
      out.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      out.push_back(static_cast<float>(factor));
    } else {
      const double smooth = (old_ctx / wavelen - low) / (high - low);
      out.push_back(static_cast<float>(1.0 / ((1 - smooth) / factor + smooth)));
    }
  }
  return out;
}

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

const char* kLlama3Template =
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";
// google/gemma-2-2b-it's template, short: chat_template.h recognises it by its turn markers.
const char* kGemmaTemplate =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim "
    "+ '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}";
const char* kChatMLTemplate =
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}";

}  // namespace

Status synthesize_model(const SynthOptions& o) {
  const SynthShape* shape = nullptr;
  for (const auto& s : synth_shapes()) {
    if (s.name == o.shape) shape = &s;
  }
  if (!shape) return Status::Error("unknown shape '" + o.shape + "' (known: " + synth_shape_names() + ")");
  const SynthFileType* ftype = find_file_type(o.type);
  if (!ftype) return Status::Error("unknown type '" + o.type + "' (known: " + synth_type_names() + ")");
  if (o.out.empty()) return Status::Error("no output path");
  auto log = [&](const std::string& s) {
    if (o.log) o.log(s);
  };
  const SynthShape& s = *shape;
  const std::string& a = s.arch;
  const bool is_qwen = s.arch.starts_with("qwen");
  const bool is_gemma = s.arch.starts_with("gemma");
  const bool qk_norm = s.arch == "qwen3" || s.arch == "gemma3" || s.arch == "qwen3moe" || s.arch == "olmoe";
  const bool qk_norm_whole = s.arch == "olmoe";
  const bool moe = s.n_expert > 0, phi3 = s.arch == "phi3";
  const bool qwen_moe = s.arch == "qwen2moe" || s.arch == "qwen3moe";
  const int hd = s.head_dim > 0 ? s.head_dim : s.n_embd / s.n_head;

  GgufWriter w;
  w.set_string("general.architecture", a);
  w.set_string("general.name", "towers-synth " + s.name + " " + o.type);
  w.set_u32("general.file_type", ftype->ftype);
  w.set_u32(a + ".context_length", s.n_ctx);
  w.set_u32(a + ".embedding_length", s.n_embd);
  w.set_u32(a + ".block_count", s.n_layer);
  w.set_u32(a + ".feed_forward_length", moe && !qwen_moe ? s.n_ff_exp : s.n_ff);
  if (moe) {
    w.set_u32(a + ".expert_count", s.n_expert);
    w.set_u32(a + ".expert_used_count", s.n_expert_used);
    if (qwen_moe) w.set_u32(a + ".expert_feed_forward_length", s.n_ff_exp);
    if (s.n_ff_shexp > 0) w.set_u32(a + ".expert_shared_feed_forward_length", s.n_ff_shexp);
  }
  if (phi3) {
    // As convert_hf_to_gguf.py's Phi3MiniModel: the window always (0: none, Phi-4), and with LongRoPE the
    // original context and attn_factor = sqrt(1 + ln(scale) / ln(original context)).
    w.set_u32(a + ".attention.sliding_window", s.sliding_window);
    if (s.rope_ctx_orig > 0) {
      const double scale = double(s.n_ctx) / s.rope_ctx_orig;
      w.set_u32(a + ".rope.scaling.original_context_length", s.rope_ctx_orig);
      w.set_f32(a + ".rope.scaling.attn_factor",
                scale > 1 ? static_cast<float>(std::sqrt(1 + std::log(scale) / std::log(double(s.rope_ctx_orig)))) : 1.0f);
    }
  }
  w.set_u32(a + ".attention.head_count", s.n_head);
  w.set_u32(a + ".attention.head_count_kv", s.n_head_kv);
  const int n_rot = s.rope_dims > 0 ? s.rope_dims : hd;
  w.set_u32(a + ".rope.dimension_count", n_rot);
  // Gemma 2's converter writes no RoPE base (readers use 10000); the others do.
  if (s.arch != "gemma2") w.set_f32(a + ".rope.freq_base", s.rope_base);
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", is_gemma ? 1e-6f : 1e-5f);
  if (s.head_dim > 0) {
    w.set_u32(a + ".attention.key_length", hd);
    w.set_u32(a + ".attention.value_length", hd);
  }
  if (s.sliding_window > 0 && !phi3) w.set_u32(a + ".attention.sliding_window", s.sliding_window);
  if (s.attn_softcap > 0) w.set_f32(a + ".attn_logit_softcapping", s.attn_softcap);
  if (s.final_softcap > 0) w.set_f32(a + ".final_logit_softcapping", s.final_softcap);
  if (s.rope_linear_scale > 0) {
    w.set_string(a + ".rope.scaling.type", "linear");
    w.set_f32(a + ".rope.scaling.factor", s.rope_linear_scale);
  }

  // Tokenizer.
  const std::string tmpl = is_qwen ? kChatMLTemplate : is_gemma ? kGemmaTemplate : kLlama3Template;
  std::string tok_path = o.tokenizer_path;
  if (tok_path.empty() && s.tokenizer != "generated" && !o.shared_dir.empty()) {
    auto p = std::filesystem::path(o.shared_dir) / "tokenizers" /
             (is_qwen ? "qwen3.tokenizer.json" : "llama3.tokenizer.json");
    if (std::filesystem::exists(p)) tok_path = p.string();
    else log("warning: " + p.string() + " not found; using a generated byte-level vocabulary");
  }
  int n_vocab = s.n_vocab;
  if (tok_path.empty()) {
    add_generated_bpe_tokenizer(w, n_vocab, tmpl);
  } else if (tok_path.ends_with(".gguf")) {
    auto src = GgufFile::open(tok_path);
    if (!src) return src.status();
    auto n = copy_gguf_tokenizer(w, **src);
    if (!n) return n.status();
    n_vocab = *n;
  } else {
    HfVocabOptions hv;
    hv.pre = is_qwen ? "qwen2" : "llama-bpe";
    hv.pad_to = s.n_vocab;
    hv.chat_template = tmpl;
    auto n = add_hf_bpe_tokenizer(w, tok_path, hv);
    if (!n) return n.status();
    n_vocab = *n;
  }
  if (n_vocab != s.n_vocab) {
    log("note: vocabulary has " + std::to_string(n_vocab) + " tokens (shape's own: " +
        std::to_string(s.n_vocab) + ")");
  }

  // Weights: uniform in [-a, a] with standard deviation weight_std (0.02: like a freshly initialised model).
  ThreadPool pool(o.threads);
  const double half_width = std::sqrt(3.0) * s.weight_std;
  int tensor_index = 0;
  // A matrix, or with n_stacked > 1 that many matrices stacked as one [cols, rows, n_stacked] tensor (experts).
  auto add_matrix = [&](const std::string& name, GgmlType type, int64_t cols, int64_t matrix_rows, int64_t n_stacked = 1) {
    const uint64_t salt = o.seed * 0x100000001B3ull + static_cast<uint64_t>(tensor_index++);
    const int64_t rows = matrix_rows * n_stacked;
    std::vector<uint64_t> dims = {uint64_t(cols), uint64_t(matrix_rows)};
    if (n_stacked > 1) dims.push_back(uint64_t(n_stacked));
    w.add_tensor(name, type, std::move(dims), [&pool, type, cols, rows, salt, half_width](uint8_t* dst, size_t) {
      const size_t stride = row_bytes(type, cols);
      pool.parallel_for(rows, [&](size_t r0, size_t r1, int) {
        std::vector<float> row(cols);
        for (size_t r = r0; r < r1; ++r) {
          uint64_t state = salt ^ (r * 0xD1B54A32D192ED03ull);
          for (int64_t c = 0; c < cols; ++c) {
            const double u = (splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
            row[c] = static_cast<float>((2 * u - 1) * half_width);
          }
          quantize_row(type, row.data(), dst + r * stride, cols);
        }
      });
    });
  };
  auto add_vector = [&](const std::string& name, int64_t n, float value, float jitter) {
    std::vector<uint8_t> bytes(n * sizeof(float));
    uint64_t state = o.seed ^ (0xA5A5ull + tensor_index++);
    for (int64_t i = 0; i < n; ++i) {
      float v = value + jitter * static_cast<float>((splitmix64(state) >> 11) * (1.0 / 9007199254740992.0) - 0.5);
      std::memcpy(&bytes[i * sizeof(float)], &v, sizeof v);
    }
    w.add_tensor_bytes(name, GgmlType::F32, {uint64_t(n)}, std::move(bytes));
  };

  add_matrix("token_embd.weight", pick_type(*ftype, "token_embd", 0, s, s.tied_embeddings, s.n_embd),
             s.n_embd, n_vocab);
  const float jit = s.norm_jitter;
  add_vector("output_norm.weight", s.n_embd, 1.0f, jit);
  if (!s.tied_embeddings) {
    add_matrix("output.weight", pick_type(*ftype, "output", 0, s, true, s.n_embd), s.n_embd, n_vocab);
  }
  if (s.llama3_rope_factor > 0) {
    auto f = llama3_rope_factors(s);
    std::vector<uint8_t> bytes(f.size() * sizeof(float));
    std::memcpy(bytes.data(), f.data(), bytes.size());
    w.add_tensor_bytes("rope_freqs.weight", GgmlType::F32, {f.size()}, std::move(bytes));
  }
  if (phi3 && s.rope_ctx_orig > 0) {
    // LongRoPE factors in the range of Phi-3.5-mini's: long ones growing with the wavelength, short near 1.
    const int half = n_rot / 2;
    std::vector<float> long_f(half), short_f(half);
    for (int i = 0; i < half; ++i) {
      long_f[i] = 1.0f + 4.0f * static_cast<float>(i) / static_cast<float>(half);
      short_f[i] = 1.0f + 0.25f * static_cast<float>(i) / static_cast<float>(half);
    }
    for (auto [name, f] : {std::pair{"rope_factors_long.weight", &long_f}, std::pair{"rope_factors_short.weight", &short_f}}) {
      std::vector<uint8_t> bytes(f->size() * sizeof(float));
      std::memcpy(bytes.data(), f->data(), bytes.size());
      w.add_tensor_bytes(name, GgmlType::F32, {f->size()}, std::move(bytes));
    }
  }
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto t = [&](const char* role, int64_t cols) { return pick_type(*ftype, role, l, s, false, cols); };
    add_vector(p + "attn_norm.weight", s.n_embd, 1.0f, jit);
    if (phi3) {
      add_matrix(p + "attn_qkv.weight", t("attn_qkv", s.n_embd), s.n_embd, (s.n_head + 2 * s.n_head_kv) * hd);
    } else {
      add_matrix(p + "attn_q.weight", t("attn_q", s.n_embd), s.n_embd, s.n_head * hd);
      add_matrix(p + "attn_k.weight", t("attn_k", s.n_embd), s.n_embd, s.n_head_kv * hd);
      add_matrix(p + "attn_v.weight", t("attn_v", s.n_embd), s.n_embd, s.n_head_kv * hd);
    }
    if (s.arch == "qwen2" || s.arch == "qwen2moe") {
      add_vector(p + "attn_q.bias", s.n_head * hd, 0.0f, 0.02f);
      add_vector(p + "attn_k.bias", s.n_head_kv * hd, 0.0f, 0.02f);
      add_vector(p + "attn_v.bias", s.n_head_kv * hd, 0.0f, 0.02f);
    }
    if (qk_norm) {
      add_vector(p + "attn_q_norm.weight", qk_norm_whole ? s.n_head * hd : hd, 1.0f, jit);
      add_vector(p + "attn_k_norm.weight", qk_norm_whole ? s.n_head_kv * hd : hd, 1.0f, jit);
    }
    add_matrix(p + "attn_output.weight", t("attn_output", s.n_head * hd), s.n_head * hd, s.n_embd);
    if (is_gemma) add_vector(p + "post_attention_norm.weight", s.n_embd, 1.0f, jit);
    add_vector(p + "ffn_norm.weight", s.n_embd, 1.0f, jit);
    if (moe) {
      // The router stays F32, as llama-quantize leaves ffn_gate_inp; the experts take the file's types.
      add_matrix(p + "ffn_gate_inp.weight", GgmlType::F32, s.n_embd, s.n_expert);
      add_matrix(p + "ffn_gate_exps.weight", t("ffn_gate", s.n_embd), s.n_embd, s.n_ff_exp, s.n_expert);
      add_matrix(p + "ffn_up_exps.weight", t("ffn_up", s.n_embd), s.n_embd, s.n_ff_exp, s.n_expert);
      add_matrix(p + "ffn_down_exps.weight", t("ffn_down", s.n_ff_exp), s.n_ff_exp, s.n_embd, s.n_expert);
      if (s.n_ff_shexp > 0) {
        add_vector(p + "ffn_gate_inp_shexp.weight", s.n_embd, 0.0f, 2.0f * s.weight_std * std::sqrt(3.0f));
        add_matrix(p + "ffn_gate_shexp.weight", t("ffn_gate", s.n_embd), s.n_embd, s.n_ff_shexp);
        add_matrix(p + "ffn_up_shexp.weight", t("ffn_up", s.n_embd), s.n_embd, s.n_ff_shexp);
        add_matrix(p + "ffn_down_shexp.weight", t("ffn_down", s.n_ff_shexp), s.n_ff_shexp, s.n_embd);
      }
    } else if (phi3) {  // gate and up stacked in ffn_up, gate first (HF Phi3MLP's gate_up_proj)
      add_matrix(p + "ffn_up.weight", t("ffn_up", s.n_embd), s.n_embd, 2 * s.n_ff);
      add_matrix(p + "ffn_down.weight", t("ffn_down", s.n_ff), s.n_ff, s.n_embd);
    } else {
      add_matrix(p + "ffn_gate.weight", t("ffn_gate", s.n_embd), s.n_embd, s.n_ff);
      add_matrix(p + "ffn_up.weight", t("ffn_up", s.n_embd), s.n_embd, s.n_ff);
      add_matrix(p + "ffn_down.weight", t("ffn_down", s.n_ff), s.n_ff, s.n_embd);
    }
    if (is_gemma) add_vector(p + "post_ffw_norm.weight", s.n_embd, 1.0f, jit);
  }
  log("writing " + o.out + " (" + s.name + ", " + o.type + ", " + std::to_string(tensor_index) + " tensors)");
  return w.write(o.out);
}

}  // namespace towers
