// The newer architectures (qwen3, gemma2, gemma3) against an independent reference: a plain numpy
// forward pass written from the published Hugging Face definitions (tests/reference/arch/: its script,
// its logits files and how they were made). Each tiny synthetic model is written here exactly as the
// reference read it (its file checksum is in the reference file). Also: a sliding window across the
// segments of a tower, and per-layer RoPE bases in the RoPE shift.
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "engine/model/forward.h"
#include "engine/model/segment.h"
#include "engine/model/synth.h"
#include "model_fixtures.h"
#include "test_support.h"

using namespace towers;

namespace {

const std::filesystem::path kReferenceDir = TOWERS_ARCH_REFERENCE_DIR;

struct Reference {
  uint64_t gguf_fnv = 0;
  std::vector<int32_t> prompt;
  int n_vocab = 0;
  std::vector<float> logits;  // [prompt][n_vocab]
  std::vector<int32_t> greedy;
  std::vector<float> decode_logits;  // [greedy][n_vocab]: at the position of greedy[i]
};

// The TWAR format of ref_forward.py.
Reference read_reference(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), p.string() << " is missing");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string b = ss.str();
  size_t at = 0;
  auto take = [&](void* out, size_t n) {
    REQUIRE_MESSAGE(at + n <= b.size(), p.string() << " is truncated");
    std::memcpy(out, b.data() + at, n);
    at += n;
  };
  char magic[4];
  uint32_t version = 0, n_prompt = 0, n_vocab = 0, n_greedy = 0;
  Reference r;
  take(magic, 4);
  REQUIRE(std::string(magic, 4) == "TWAR");
  take(&version, 4);
  REQUIRE(version == 1);
  take(&r.gguf_fnv, 8);
  take(&n_prompt, 4);
  take(&n_vocab, 4);
  r.n_vocab = static_cast<int>(n_vocab);
  r.prompt.resize(n_prompt);
  take(r.prompt.data(), n_prompt * 4);
  r.logits.resize(size_t(n_prompt) * n_vocab);
  take(r.logits.data(), r.logits.size() * 4);
  take(&n_greedy, 4);
  r.greedy.resize(n_greedy);
  take(r.greedy.data(), n_greedy * 4);
  r.decode_logits.resize(size_t(n_greedy) * n_vocab);
  take(r.decode_logits.data(), r.decode_logits.size() * 4);
  REQUIRE(at == b.size());
  return r;
}

uint64_t fnv1a64(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  uint64_t h = 0xCBF29CE484222325ull;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    for (std::streamsize i = 0; i < in.gcount(); ++i) h = (h ^ static_cast<uint8_t>(buf[i])) * 0x100000001B3ull;
  }
  return h;
}

std::filesystem::path synth_file(const std::string& shape, const std::string& type) {
  SynthOptions o;
  o.shape = shape;
  o.type = type;
  o.out = (test::temp_dir() / ("arch-" + shape + "-" + type + ".gguf")).string();
  auto st = synthesize_model(o);
  REQUIRE_MESSAGE(st.ok(), st.message());
  return o.out;
}

std::unique_ptr<Model> load(const std::filesystem::path& p) {
  auto m = Model::load(p.string());
  REQUIRE_MESSAGE(m.ok(), m.error());
  return std::move(m.value());
}

// A file with only the keys every family needs (no tensors), to test what the loader refuses.
GgufWriter bare_header(const std::string& arch) {
  GgufWriter w;
  w.set_string("general.architecture", arch);
  for (const char* key : {"embedding_length", "block_count", "feed_forward_length"}) w.set_u32(arch + "." + key, 64);
  w.set_u32(arch + ".attention.head_count", 4);
  return w;
}

// The loader's error for what w writes (which it must refuse).
std::string load_error(const GgufWriter& w, const std::string& file_name) {
  const auto path = test::temp_dir() / file_name;
  REQUIRE(w.write(path.string()).ok());
  auto m = Model::load(path.string());
  REQUIRE_FALSE(m.ok());
  return m.error();
}

int32_t argmax(const float* v, int n) { return static_cast<int32_t>(std::max_element(v, v + n) - v); }

}  // namespace

TEST_CASE("architectures: logits and 64 greedy tokens equal the numpy reference from the HF definitions") {
  ThreadPool pool(2);
  for (const char* shape : {"tiny-qwen3", "tiny-gemma2", "tiny-gemma3", "tiny-phi3", "tiny-mixtral", "tiny-qwen2moe",
                            "tiny-qwen3moe", "tiny-olmoe"}) {
    const std::string shape_name = shape;
    CAPTURE(shape_name);
    const auto path = synth_file(shape, "f16");
    const Reference ref = read_reference(kReferenceDir / (std::string(shape) + ".ref"));
    REQUIRE_MESSAGE(fnv1a64(path) == ref.gguf_fnv,
                    "the synthetic model is not the file the reference was made from: regenerate it "
                    "(tests/reference/arch/README.md)");
    auto model = load(path);
    REQUIRE(model->config().n_vocab == ref.n_vocab);
    REQUIRE(model->config().arch_name == (shape_name == "tiny-mixtral" ? "llama" : shape_name.substr(5)));
    const int V = ref.n_vocab;
    double ref_max = 0;
    for (float x : ref.logits) ref_max = std::max(ref_max, double(std::abs(x)));
    for (Kernels kernels : {Kernels::Reference, Kernels::Fast}) {
      CAPTURE(static_cast<int>(kernels));
      Forward fwd(*model, pool, kernels);
      DenseKvCache cache(model->config(), static_cast<int32_t>(ref.prompt.size() + ref.greedy.size()));
      std::vector<float> logits = test::eval_all(fwd, cache, ref.prompt);
      const double diff = test::max_abs_diff(logits, ref.logits);
      MESSAGE(std::string(shape) << ": prompt max|dlogit| " << diff << " of max|logit| " << ref_max);
      CHECK(diff <= 1e-3 * ref_max);
      // Greedy decoding one token at a time (the window and the cache as decode sees them): the same
      // tokens, and at every step the same logits within the same bound.
      std::vector<int32_t> got;
      std::vector<float> decode_logits;
      int32_t next = argmax(&logits[logits.size() - V], V);
      for (size_t i = 0; i < ref.greedy.size(); ++i) {
        got.push_back(next);
        REQUIRE(fwd.eval(cache, std::span<const int32_t>(&next, 1), Logits::Last, logits).ok());
        decode_logits.insert(decode_logits.end(), logits.begin(), logits.end());
        next = argmax(logits.data(), V);
      }
      CHECK(got == ref.greedy);
      if (got == ref.greedy) {
        const double decode_diff = test::max_abs_diff(decode_logits, ref.decode_logits);
        MESSAGE(std::string(shape) << ": decode max|dlogit| " << decode_diff);
        CHECK(decode_diff <= 1e-3 * ref_max);
      }
    }
  }
}

TEST_CASE("architectures: a sliding window across a tower's segments equals monolithic prefill") {
  // tiny-gemma2's window is 5: segments of 3, 4 and 6 tokens put every window across a boundary.
  ThreadPool pool(2);
  for (const char* shape : {"tiny-gemma2", "tiny-gemma3"}) {
    const std::string shape_name = shape;
    CAPTURE(shape_name);
    auto model = load(synth_file(shape, "f16"));
    REQUIRE(model->config().sliding_window == 5);
    Forward fwd(*model, pool, Kernels::Reference);
    // The tower sums attention over segments in another order than the dense cache (~1e-7 apart);
    // ggml's f16 table GELU would turn such differences into f16 steps of a gate, so this compares
    // the two paths in f32.
    fwd.set_rounding(Rounding::F32);
    std::vector<int32_t> ids;
    for (int i = 0; i < 24; ++i) ids.push_back((11 + 29 * i) % model->config().n_vocab);
    DenseKvCache dense(model->config(), 24);
    const std::vector<float> mono = test::eval_all(fwd, dense, ids);

    Tower tower(model->config(), {}, 24);
    const int cuts[] = {3, 7, 13};
    int from = 0;
    std::vector<float> logits;
    for (int i = 0; i < 3; ++i) {
      std::span<const int32_t> part(ids.data() + from, cuts[i] - from);
      REQUIRE(fwd.eval(tower, part, Logits::Last, logits).ok());
      REQUIRE(tower.seal_tail({part.begin(), part.end()}, KvQuant::F32, 10 + i) != nullptr);
      from = cuts[i];
    }
    std::span<const int32_t> rest(ids.data() + from, ids.size() - from);
    std::vector<float> towered = test::eval_all(fwd, tower, rest);
    std::vector<float> mono_rest(mono.end() - towered.size(), mono.end());
    CHECK(test::max_abs_diff(towered, mono_rest) <= 1e-5);
  }
}

TEST_CASE("architectures: gemma3's local layers rotate with base 10000, its global ones with the file's base and scale") {
  auto model = load(synth_file("tiny-gemma3", "f16"));
  const ModelConfig& c = model->config();
  REQUIRE(c.is_swa(0));
  REQUIRE(!c.is_swa(5));
  const Rope rope(c);
  const float pos = 37.0f;
  for (int layer : {0, 5}) {
    CAPTURE(layer);
    const double base = layer == 0 ? 10000.0 : 1000000.0, scale = layer == 0 ? 1.0 : 8.0;
    std::vector<float> v(c.head_dim);
    for (int i = 0; i < c.head_dim; ++i) v[i] = 0.1f * static_cast<float>(i + 1);
    std::vector<float> want(v);
    const int half = c.head_dim / 2;
    for (int i = 0; i < half; ++i) {  // neox pairs (i, i + half)
      const double angle = pos / scale * std::pow(base, -2.0 * i / c.head_dim);
      want[i] = static_cast<float>(v[i] * std::cos(angle) - v[i + half] * std::sin(angle));
      want[i + half] = static_cast<float>(v[i] * std::sin(angle) + v[i + half] * std::cos(angle));
    }
    rope.rotate(v.data(), 1, pos, layer);
    CHECK(test::max_abs_diff(v, want) <= 1e-5);
  }
}

TEST_CASE("architectures: the table's traits as loaded, and a gemma file without its window is refused by name") {
  auto gemma2 = load(synth_file("tiny-gemma2", "f16"));
  const ModelConfig& g2 = gemma2->config();
  CHECK(g2.head_dim == 32);
  CHECK(g2.q_dim() == 128);  // != n_embd 64
  CHECK(g2.embd_scale == doctest::Approx(8.0));
  CHECK(g2.attn_scale == doctest::Approx(1.0 / std::sqrt(32.0)));
  CHECK(g2.attn_softcap == 2.0f);
  CHECK(g2.final_softcap == 3.0f);
  CHECK(g2.ffn_gate == FfnGate::GeluTanh);
  CHECK(g2.post_norms);
  CHECK_FALSE(g2.qk_norm);
  CHECK(g2.rope_base == 10000.0f);  // gemma2 files carry no base
  for (int l = 0; l < g2.n_layer; ++l) CHECK(g2.is_swa(l) == (l % 2 == 0));

  auto gemma3 = load(synth_file("tiny-gemma3", "f16"));
  const ModelConfig& g3 = gemma3->config();
  for (int l = 0; l < g3.n_layer; ++l) CHECK(g3.is_swa(l) == (l != 5));
  CHECK(g3.attn_softcap == 0.0f);
  CHECK(g3.final_softcap == 0.0f);
  CHECK(g3.rope_base_swa == 10000.0f);
  CHECK(g3.qk_norm);

  auto qwen3 = load(synth_file("tiny-qwen3", "f16"));
  CHECK(qwen3->config().qk_norm);
  CHECK_FALSE(qwen3->config().qkv_bias);
  CHECK_FALSE(qwen3->config().post_norms);
  CHECK(qwen3->config().swa_layer.empty());

  const std::string no_window = load_error(bare_header("gemma2"), "arch-gemma2-no-window.gguf");
  CAPTURE(no_window);
  CHECK(no_window.find("gemma2.attention.sliding_window") != std::string::npos);

  const std::string refused = load_error(bare_header("phimoe"), "arch-phimoe.gguf");
  CAPTURE(refused);
  CHECK(refused.find("unsupported architecture 'phimoe' (supported: llama, qwen2, qwen3, gemma2, gemma3, phi3, "
                     "qwen2moe, qwen3moe, olmoe)") != std::string::npos);
}

TEST_CASE("mixture of experts: a token's logits do not depend on the tokens that share its step") {
  // Prefill of 24 tokens (experts batched over the tokens routed to them), the same tokens one at a time,
  // and the same prompt beside another sequence in one eval_batch: bit-identical, with either kernel set
  // and in a quantized file (whose fast path runs the integer kernels on the gathered rows).
  ThreadPool pool(2);
  for (const char* type : {"f16", "q8_0"}) {
    for (const char* shape : {"tiny-qwen2moe", "tiny-olmoe"}) {
      const std::string shape_name = shape, type_name = type;
      CAPTURE(shape_name);
      CAPTURE(type_name);
      auto model = load(synth_file(shape, type));
      const int V = model->config().n_vocab;
      std::vector<int32_t> ids, other;
      for (int i = 0; i < 24; ++i) ids.push_back((5 + 31 * i) % V), other.push_back((100 + 7 * i) % V);
      for (Kernels kernels : {Kernels::Reference, Kernels::Fast}) {
        CAPTURE(static_cast<int>(kernels));
        Forward fwd(*model, pool, kernels);
        DenseKvCache whole(model->config(), 24), single(model->config(), 24), beside(model->config(), 24),
            second(model->config(), 24);
        const std::vector<float> batched = test::eval_all(fwd, whole, ids);
        std::vector<float> one_by_one, logits;
        for (int32_t t : ids) {
          REQUIRE(fwd.eval(single, std::span<const int32_t>(&t, 1), Logits::All, logits).ok());
          one_by_one.insert(one_by_one.end(), logits.begin(), logits.end());
        }
        CHECK(batched == one_by_one);
        const Forward::Sequence two[] = {{&second, other, Logits::All}, {&beside, ids, Logits::All}};
        REQUIRE(fwd.eval_batch(two, logits).ok());
        CHECK(std::vector<float>(logits.end() - batched.size(), logits.end()) == batched);
      }
    }
  }
}

TEST_CASE("mixture of experts: decode reads only the chosen experts, a prefill step each chosen expert once") {
  ThreadPool pool(2);
  auto model = load(synth_file("tiny-qwen3moe", "q8_0"));
  const ModelConfig& c = model->config();
  REQUIRE(c.n_expert == 8);
  REQUIRE(c.n_expert_used == 3);
  uint64_t dense = 0, expert = 0;  // per layer: what every token reads, and one expert's three matrices
  for (const LayerWeights& L : model->layers) {
    for (const Weight* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate_inp}) dense += w->bytes();
    expert = L.gate_exps[0].bytes() + L.up_exps[0].bytes() + L.down_exps[0].bytes();
  }
  const uint64_t fixed = dense + model->output.bytes() + model->tok_embd.row_stride();
  Forward fwd(*model, pool, Kernels::Fast);
  DenseKvCache cache(c, 64);
  std::vector<float> logits;
  const int32_t tok = 17;
  fwd.reset_weight_bytes_read();
  REQUIRE(fwd.eval(cache, std::span<const int32_t>(&tok, 1), Logits::Last, logits).ok());
  CHECK(fwd.weight_bytes_read() == fixed + uint64_t(c.n_layer) * c.n_expert_used * expert);
  // 32 tokens in one step: every expert some token chose is read once, so at most all 8 per layer,
  // far less than 32 tokens x 3 experts.
  std::vector<int32_t> ids;
  for (int i = 0; i < 32; ++i) ids.push_back((3 + 13 * i) % c.n_vocab);
  fwd.reset_weight_bytes_read();
  REQUIRE(fwd.eval(cache, ids, Logits::Last, logits).ok());
  const uint64_t read = fwd.weight_bytes_read() - 31 * model->tok_embd.row_stride();
  CHECK(read > fixed + uint64_t(c.n_layer) * c.n_expert_used * expert);
  CHECK(read <= fixed + uint64_t(c.n_layer) * c.n_expert * expert);
}

TEST_CASE("phi3 and the mixtures of experts: the traits as loaded, and bad expert metadata refused by name") {
  auto phi3 = load(synth_file("tiny-phi3", "f16"));
  const ModelConfig& p = phi3->config();
  CHECK(p.sliding_window == 5);
  for (int l = 0; l < p.n_layer; ++l) CHECK(p.is_swa(l));
  CHECK(p.rope_ctx_orig == 16);
  CHECK(p.rope_attn_factor == doctest::Approx(std::sqrt(1 + std::log(128.0) / std::log(16.0))));
  REQUIRE(p.n_rot == 12);  // of head_dim 16
  REQUIRE(p.rope_freq_factors.size() == 6);
  CHECK(p.rope_freq_factors[5] == doctest::Approx(1.0 + 4.0 * 5 / 6));  // the long factors: 2048 > 16
  // Fused tensors are views: q, k, v consecutive rows of attn_qkv; gate then up in ffn_up.
  const LayerWeights& L = phi3->layers[0];
  CHECK(L.wk.data == L.wq.data + L.wq.bytes());
  CHECK(L.wv.data == L.wk.data + L.wk.bytes());
  CHECK(L.w_up.data == L.w_gate.data + L.w_gate.bytes());
  CHECK(L.w_gate.rows == p.n_ff);

  // A RoPE shift stays a pure rotation: a key embedded at 0 and rotated by d equals one embedded at d.
  const Rope rope(p);
  std::vector<float> k0(p.head_dim), kd(p.head_dim);
  for (int i = 0; i < p.head_dim; ++i) k0[i] = kd[i] = 0.05f * static_cast<float>(i + 1);
  rope.embed(k0.data(), 1, 0.0f, 0);
  rope.rotate(k0.data(), 1, 9.0f, 0);
  rope.embed(kd.data(), 1, 9.0f, 0);
  CHECK(test::max_abs_diff(k0, kd) <= 1e-5);

  auto olmoe = load(synth_file("tiny-olmoe", "f16"));
  CHECK(olmoe->config().qk_norm_whole);
  CHECK_FALSE(olmoe->config().expert_weights_norm);
  CHECK(olmoe->layers[0].q_norm.cols == olmoe->config().q_dim());
  auto mixtral = load(synth_file("tiny-mixtral", "f16"));
  CHECK(mixtral->config().is_moe());
  CHECK(mixtral->config().expert_weights_norm);
  CHECK(mixtral->config().rope_style == RopeStyle::Normal);
  auto qwen2moe = load(synth_file("tiny-qwen2moe", "f16"));
  CHECK(qwen2moe->config().n_ff_shexp == 64);
  CHECK_FALSE(qwen2moe->config().expert_weights_norm);
  CHECK(load(synth_file("tiny-qwen3moe", "f16"))->config().expert_weights_norm);

  // A mixture-of-experts family without its expert count, or choosing more experts than it has.
  GgufWriter w = bare_header("qwen3moe");
  CHECK(load_error(w, "arch-qwen3moe-bad.gguf").find("missing metadata key qwen3moe.expert_count") != std::string::npos);
  w.set_u32("qwen3moe.expert_count", 4);
  w.set_u32("qwen3moe.expert_used_count", 5);
  CHECK(load_error(w, "arch-qwen3moe-bad.gguf").find("qwen3moe.expert_used_count 5 exceeds expert_count 4") !=
        std::string::npos);
  w.set_u32("qwen3moe.expert_used_count", 2);
  w.set_u32("qwen3moe.expert_gating_func", 2);
  CHECK(load_error(w, "arch-qwen3moe-bad.gguf").find("expert_gating_func = 2 is not supported") != std::string::npos);
}

// Forward::attention's tiles (a tile's query rows read each KV block together): a row's result must not
// depend on the tile size, on which tile or thread computed it, or on prefilling vs decoding one token
// at a time (the cold-tier codec encodes with the one and decodes with the other). Untiled (tiles of
// one row, one thread) is the reference: every other way must give its bits. Prompts of 300 tokens:
// two whole attention blocks of 128 and a ragged tail; tiles of 7 rows end mid-block; GQA in every
// shape; windows of 5 (gemma2: soft-caps too; phi3) cut every tile, gemma3-w200's window cuts some tiles
// and not others, and its sixth layer is global. A tower of Q4 and Q8 segments checks the quantized
// spans, which must also stay within the quantization's drift of the F32 logits.
TEST_CASE("attention tiles: any tile size, thread count or token-by-token decode gives the untiled bits") {
  constexpr int kTokens = 300;
  for (const char* shape : {"tiny", "tiny-gemma2", "tiny-phi3", "tiny-gemma3-w200"}) {
    const std::string shape_name = shape;
    CAPTURE(shape_name);
    auto model = load(synth_file(shape, "q8_0"));
    const ModelConfig& c = model->config();
    REQUIRE(c.n_head > c.n_head_kv);  // GQA
    std::vector<int32_t> ids;
    for (int i = 0; i < kTokens; ++i) ids.push_back((17 + 31 * i) % c.n_vocab);
    auto prefill = [&](int threads, int tile_rows, KvCache& cache, std::span<const int32_t> part) {
      ThreadPool pool(threads);
      Forward fwd(*model, pool);
      fwd.set_attention_tile_rows(tile_rows);
      return test::eval_all(fwd, cache, part);
    };
    DenseKvCache untiled_cache(c, kTokens);
    const std::vector<float> untiled = prefill(1, 1, untiled_cache, ids);
    for (const auto& run : {std::pair{2, 0}, std::pair{1, 0}, std::pair{2, 7}, std::pair{2, 128}}) {
      const int threads = run.first, tile_rows = run.second;  // named: clang 14 refuses CAPTURE of a binding
      CAPTURE(threads);
      CAPTURE(tile_rows);
      DenseKvCache cache(c, kTokens);
      const std::vector<float> tiled = prefill(threads, tile_rows, cache, ids);
      REQUIRE(tiled.size() == untiled.size());
      CHECK(std::memcmp(tiled.data(), untiled.data(), tiled.size() * sizeof(float)) == 0);
    }
    {  // the first 40 tokens in one step, then one token at a time
      ThreadPool pool(2);
      Forward fwd(*model, pool);
      DenseKvCache cache(c, kTokens);
      std::vector<float> logits = test::eval_all(fwd, cache, std::span<const int32_t>(ids.data(), 40));
      int same = 0;
      for (int i = 40; i < kTokens; ++i) {
        REQUIRE(fwd.eval(cache, std::span<const int32_t>(&ids[i], 1), Logits::Last, logits).ok());
        same += std::memcmp(logits.data(), &untiled[size_t(i) * c.n_vocab], c.n_vocab * sizeof(float)) == 0;
      }
      CHECK(same == kTokens - 40);
    }
    // Segments of 140 (Q4) and 90 (Q8) tokens, then the last 70 prefilled over them.
    std::vector<float> quantized[2];
    for (int v = 0; v < 2; ++v) {
      const int tile_rows = v == 0 ? 1 : 0;
      Tower tower(c, {}, kTokens);
      const int cuts[] = {0, 140, 230};
      const KvQuant formats[] = {KvQuant::Q4, KvQuant::Q8};
      for (int s = 0; s < 2; ++s) {
        const std::span<const int32_t> part(ids.data() + cuts[s], cuts[s + 1] - cuts[s]);
        prefill(v == 0 ? 1 : 2, tile_rows, tower, part);
        REQUIRE(tower.seal_tail({part.begin(), part.end()}, formats[s], 20 + s) != nullptr);
      }
      quantized[v] = prefill(v == 0 ? 1 : 2, tile_rows, tower, std::span<const int32_t>(ids.data() + 230, 70));
    }
    CHECK(std::memcmp(quantized[0].data(), quantized[1].data(), quantized[0].size() * sizeof(float)) == 0);
    const std::vector<float> f32_rest(untiled.end() - quantized[1].size(), untiled.end());
    double ref_max = 0;
    for (float x : f32_rest) ref_max = std::max(ref_max, double(std::abs(x)));
    const double drift = test::max_abs_diff(quantized[1], f32_rest);
    MESSAGE(shape_name << ": Q4+Q8 tower max|dlogit| " << drift << " of max|logit| " << ref_max);
    CHECK(drift > 0);                 // the quantized spans were read
    CHECK(drift <= 0.25 * ref_max);   // and they are the same tokens' keys and values
  }
}
