// Model loading: hyper-parameters from metadata, and a clear error for everything we cannot run.
#include <cstring>
#include <fstream>
#include <iterator>

#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/text/tokenizer.h"
#include "engine/text/vocab_import.h"
#include "test_support.h"

using namespace towers;

namespace {

struct Spec {
  std::string arch = "llama";
  int n_embd = 64, n_head = 4, n_head_kv = 2, n_ff = 128, n_layer = 1;
  GgmlType matrix_type = GgmlType::F32;
  bool drop_ffn_up = false;
  int64_t q_rows = -1;  // override the rows of attn_q (wrong shape)
};

// A minimal but complete model file, built in memory.
std::vector<uint8_t> build(const Spec& s) {
  GgufWriter w;
  w.set_string("general.architecture", s.arch);
  const std::string a = s.arch;
  w.set_u32(a + ".embedding_length", s.n_embd);
  w.set_u32(a + ".block_count", s.n_layer);
  w.set_u32(a + ".feed_forward_length", s.n_ff);
  w.set_u32(a + ".attention.head_count", s.n_head);
  w.set_u32(a + ".attention.head_count_kv", s.n_head_kv);
  w.set_u32(a + ".context_length", 128);
  add_generated_bpe_tokenizer(w, 300, "");
  const int V = 300, hd = s.n_embd / s.n_head;
  auto mat = [&](const std::string& name, int64_t cols, int64_t rows, GgmlType t) {
    w.add_tensor(name, t, {uint64_t(cols), uint64_t(rows)}, [](uint8_t* d, size_t n) { std::memset(d, 0, n); });
  };
  mat("token_embd.weight", s.n_embd, V, GgmlType::F32);
  mat("output_norm.weight", s.n_embd, 1, GgmlType::F32);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    mat(p + "attn_norm.weight", s.n_embd, 1, GgmlType::F32);
    mat(p + "ffn_norm.weight", s.n_embd, 1, GgmlType::F32);
    mat(p + "attn_q.weight", s.n_embd, s.q_rows >= 0 ? s.q_rows : s.n_head * hd, s.matrix_type);
    mat(p + "attn_k.weight", s.n_embd, s.n_head_kv * hd, s.matrix_type);
    mat(p + "attn_v.weight", s.n_embd, s.n_head_kv * hd, s.matrix_type);
    mat(p + "attn_output.weight", s.n_head * hd, s.n_embd, s.matrix_type);
    mat(p + "ffn_gate.weight", s.n_embd, s.n_ff, s.matrix_type);
    if (!s.drop_ffn_up) mat(p + "ffn_up.weight", s.n_embd, s.n_ff, s.matrix_type);
    mat(p + "ffn_down.weight", s.n_ff, s.n_embd, s.matrix_type);
  }
  return w.to_bytes();
}

// Loads a spec; returns the error message, or "" on success.
std::string load_error(const Spec& s, ModelConfig* config = nullptr) {
  std::vector<uint8_t> bytes = build(s);
  auto f = GgufFile::from_memory(bytes.data(), bytes.size());
  if (!f) return "gguf: " + f.error();
  auto m = Model::from_gguf(f.value());
  if (!m) return m.error();
  if (config) *config = (*m)->config();
  return "";
}

}  // namespace

TEST_CASE("a minimal llama file loads with the hyper-parameters of its metadata") {
  ModelConfig c;
  REQUIRE(load_error(Spec{}, &c) == "");
  CHECK(c.arch == Arch::Llama);
  CHECK(c.n_embd == 64);
  CHECK(c.n_head == 4);
  CHECK(c.n_head_kv == 2);
  CHECK(c.head_dim == 16);
  CHECK(c.n_rot == 16);
  CHECK(c.n_vocab == 300);
  CHECK(c.n_ctx_train == 128);
  CHECK(c.tied_embeddings);  // no output.weight
  CHECK(c.rope_style == RopeStyle::Normal);
  CHECK(c.rope_base == 10000.0f);
}

TEST_CASE("an unsupported architecture names the supported ones") {
  Spec s;
  s.arch = "gpt2";
  std::string e = load_error(s);
  CHECK(e.find("unsupported architecture 'gpt2'") != std::string::npos);
  CHECK(e.find("llama, qwen2") != std::string::npos);
}

TEST_CASE("an unsupported tensor type names the supported ones") {
  Spec s;
  s.n_embd = 256, s.n_ff = 256;
  for (GgmlType t : {GgmlType::IQ2_XXS, GgmlType::IQ3_S, GgmlType::IQ1_M, GgmlType::TQ1_0}) {
    s.matrix_type = t;
    std::string e = load_error(s);
    CAPTURE(e);
    CHECK(e.find(std::string(ggml_type_name(t)) + ", which is not supported") != std::string::npos);
    CHECK(e.find("Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS") != std::string::npos);
  }
}

TEST_CASE("missing tensors, wrong shapes and inconsistent heads are named") {
  Spec s;
  s.drop_ffn_up = true;
  CHECK(load_error(s).find("missing tensor blk.0.ffn_up.weight") != std::string::npos);
  Spec w;
  w.q_rows = 32;
  CHECK(load_error(w).find("tensor blk.0.attn_q.weight has shape [64, 32], expected [64, 64]") != std::string::npos);
  Spec h;
  h.n_head = 4, h.n_head_kv = 3;
  CHECK(load_error(h).find("not a multiple of head_count_kv 3") != std::string::npos);
  Spec z;
  z.n_embd = 60, z.n_head = 8;
  CHECK(load_error(z).find("not divisible by head_count") != std::string::npos);
}

TEST_CASE("packed matrices: their file pages are released, and still read back as the file's bytes") {
  SynthOptions o;
  o.shape = "tiny";
  o.type = "q4_k_m";
  o.out = (test::temp_dir() / "model-release-tiny-q4_k_m.gguf").string();
  REQUIRE(synthesize_model(o).ok());
  auto m = Model::load(o.out);
  REQUIRE(m.ok());
  const Model& model = *m.value();
  CHECK(model.packed_bytes() > 0);
  const Weight& w = model.layers[0].w_gate;  // Q4_K, 768 rows of 144 bytes: many whole pages
  REQUIRE(w.type == GgmlType::Q4_K);
  REQUIRE(w.packed != nullptr);
  CHECK(model.release_packed_sources() > 0);
  // MADV_DONTNEED on the read-only file mapping drops pages; reading faults in the file's bytes.
  std::ifstream in(o.out, std::ios::binary);
  const std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const GgufTensorInfo* t = model.file().find_tensor("blk.0.ffn_gate.weight");
  REQUIRE(t != nullptr);
  const size_t pos = model.file().data_offset() + t->offset;
  REQUIRE(pos + t->nbytes <= file.size());
  CHECK(std::memcmp(w.data, file.data() + pos, t->nbytes) == 0);
}
