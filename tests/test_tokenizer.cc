// Tokenizers against llama.cpp's test vectors (llama-spm, phi-3, gpt-2, starcoder, deepseek-llm,
// deepseek-coder, falcon, mpt and refact from llama.cpp's vocab GGUFs; llama-bpe, qwen2 and
// deepseek-r1-qwen from Hugging Face tokenizer.json files converted to GGUF here), decode round trips,
// the streaming detokenizer, special-token parsing and malformed vocabularies. Pre-tokenizers without a
// vocab in shared/ (tekken, smollm, command-r) and Gemma's SentencePiece rules: test_pretokenizer.cc.
#include <algorithm>
#include <array>
#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "engine/gguf/gguf.h"
#include "engine/text/tokenizer.h"
#include "engine/text/vocab_import.h"
#include "test_support.h"
#include "token_pieces.h"

using namespace towers;

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

// The framing of llama.cpp's tests/test-tokenizer-0.cpp: texts separated by "\n__ggml_vocab_test__\n"
// (the file ends with one, so there is no empty last case); one line of ids per case.
std::vector<Case> read_vectors(const std::string& name) {
  auto inp = test::shared_file("tokenizers/ggml-vocab-" + name + ".gguf.inp");
  auto out = test::shared_file("tokenizers/ggml-vocab-" + name + ".gguf.out");
  if (inp.empty() || out.empty()) return {};
  const std::string raw = slurp(inp);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < raw.size();) {
    const size_t next = raw.find(sep, pos);
    if (next == std::string::npos) {
      texts.push_back(raw.substr(pos));
      break;
    }
    texts.push_back(raw.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<std::vector<int32_t>> ids;
  std::ifstream o(out);
  for (std::string line; std::getline(o, line);) {
    std::istringstream ls(line);
    std::vector<int32_t> v;
    for (int32_t x; ls >> x;) v.push_back(x);
    ids.push_back(std::move(v));
  }
  REQUIRE_MESSAGE(texts.size() == ids.size(), name << ": " << texts.size() << " texts but " << ids.size()
                                                    << " id lines");
  std::vector<Case> cases;
  for (size_t i = 0; i < texts.size(); ++i) cases.push_back({texts[i], ids[i]});
  return cases;
}

struct Loaded {
  std::shared_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
  double load_ms = 0;
};

// Vocabularies by test-vector name, loaded once per process. nullptr (and a SKIP message) when the
// shared data is missing.
const Tokenizer* vocab(const std::string& name) {
  static std::map<std::string, Loaded> cache;
  if (auto it = cache.find(name); it != cache.end()) return it->second.tok.get();
  std::filesystem::path gguf;
  if (name != "llama-bpe" && name != "qwen2" && name != "deepseek-r1-qwen") {
    gguf = test::shared_file("tokenizers/ggml-vocab-" + name + ".gguf");
    if (gguf.empty()) return nullptr;
  } else {
    const bool llama = name == "llama-bpe";
    auto json = test::shared_file(llama ? "tokenizers/llama3.tokenizer.json" : "tokenizers/qwen3.tokenizer.json");
    if (json.empty()) return nullptr;
    GgufWriter w;
    HfVocabOptions opt;
    opt.pre = name;  // llama-bpe, qwen2, deepseek-r1-qwen
    auto n = add_hf_bpe_tokenizer(w, json.string(), opt);
    REQUIRE_MESSAGE(n.ok(), n.error());
    gguf = test::temp_dir() / ("vocab-" + name + ".gguf");
    Status s = w.write(gguf.string());
    REQUIRE_MESSAGE(s.ok(), s.message());
  }
  auto f = GgufFile::open(gguf.string());
  REQUIRE_MESSAGE(f.ok(), f.error());
  Loaded l;
  l.file = f.value();
  const auto t0 = Clock::now();
  auto t = Tokenizer::from_gguf(*l.file);
  l.load_ms = ms_since(t0);
  REQUIRE_MESSAGE(t.ok(), t.error());
  l.tok = std::move(t.value());
  // Reported, not asserted: a speed target does not belong in a unit test (a loaded CI machine
  // would fail it); load time is a benchmark's business.
  MESSAGE(name << ": " << l.tok->kind() << ", " << l.tok->n_vocab() << " tokens, loaded in " << l.load_ms
               << " ms");
  return (cache[name] = std::move(l)).tok.get();
}

std::string ids_str(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += std::to_string(x) + " ";
  return s;
}

std::string escape(std::string_view s) {
  std::string o;
  for (char c : s) {
    if (c == '\n') o += "\\n";
    else if (c == '\t') o += "\\t";
    else if (c == '\r') o += "\\r";
    else o += c;
  }
  return o;
}

void run_vectors(const std::string& name) {
  const Tokenizer* tok = vocab(name);
  auto cases = read_vectors(name);
  if (!tok || cases.empty()) return;
  CHECK(cases.size() == 46);  // shared/README says 47; the files hold 46
  int pass = 0;
  double ms = 0;
  for (const auto& c : cases) {
    const auto t0 = Clock::now();
    auto got = tok->encode(c.text, /*add_bos=*/false, /*parse_special=*/false);
    ms += ms_since(t0);
    if (got == c.ids) {
      ++pass;
    } else {
      MESSAGE(name << " mismatch for '" << escape(c.text) << "'\n  expected " << ids_str(c.ids) << "\n  got      "
                   << ids_str(got));
    }
  }
  MESSAGE(name << ": " << pass << "/" << cases.size() << " llama.cpp vectors pass (" << ms << " ms)");
  CHECK(pass == static_cast<int>(cases.size()));
}

// Feeds ids one at a time; every chunk must be valid UTF-8. Returns the concatenation (with flush).
std::string stream(const Tokenizer& tok, const std::vector<int32_t>& ids, int* held = nullptr) {
  Detokenizer d(tok);
  std::string s;
  for (int32_t id : ids) {
    std::string chunk = d.feed(id);
    CHECK(is_valid_utf8(chunk));
    if (held && chunk.empty() && !tok.token_to_piece(id).empty()) ++*held;
    s += chunk;
  }
  std::string tail = d.flush();
  CHECK(is_valid_utf8(tail));
  return s + tail;
}

using test::raw_pieces;

const std::string kAllVocabs[] = {"llama-spm", "llama-bpe", "qwen2",          "deepseek-r1-qwen", "phi-3",
                                  "gpt-2",     "starcoder", "deepseek-llm",   "deepseek-coder",   "falcon",
                                  "mpt",       "refact"};

}  // namespace

TEST_CASE("llama-spm: llama.cpp tokenizer vectors") { run_vectors("llama-spm"); }
TEST_CASE("llama-bpe: llama.cpp tokenizer vectors (vocab from llama3 tokenizer.json)") { run_vectors("llama-bpe"); }
TEST_CASE("qwen2: llama.cpp tokenizer vectors (vocab from qwen3 tokenizer.json)") { run_vectors("qwen2"); }
TEST_CASE("deepseek-r1-qwen: llama.cpp tokenizer vectors (same base BPE as qwen2)") { run_vectors("deepseek-r1-qwen"); }
// llama.cpp's own vocab GGUFs (shared/tokenizers), one per pre-tokenizer.
TEST_CASE("phi-3: llama.cpp tokenizer vectors (SentencePiece, Phi-3's special-token rules)") { run_vectors("phi-3"); }
TEST_CASE("gpt-2: llama.cpp tokenizer vectors") { run_vectors("gpt-2"); }
TEST_CASE("starcoder: llama.cpp tokenizer vectors") { run_vectors("starcoder"); }
TEST_CASE("deepseek-llm: llama.cpp tokenizer vectors") { run_vectors("deepseek-llm"); }
TEST_CASE("deepseek-coder: llama.cpp tokenizer vectors") { run_vectors("deepseek-coder"); }
TEST_CASE("falcon: llama.cpp tokenizer vectors") { run_vectors("falcon"); }
TEST_CASE("mpt: llama.cpp tokenizer vectors") { run_vectors("mpt"); }
TEST_CASE("refact: llama.cpp tokenizer vectors") { run_vectors("refact"); }

TEST_CASE("decode(encode(text)) == text for every vector text, streaming equals whole decoding") {
  for (const std::string& name : kAllVocabs) {
    const Tokenizer* tok = vocab(name);
    auto cases = read_vectors(name);
    if (!tok || cases.empty()) continue;
    int ok = 0;
    for (const auto& c : cases) {
      for (bool bos : {false, true}) {
        auto ids = tok->encode(c.text, bos, false);
        const std::string whole = tok->decode(ids);
        const std::string streamed = stream(*tok, ids);
        CHECK(streamed == whole);
        CHECK(whole == sanitize_utf8(raw_pieces(*tok, ids)));
        if (whole == c.text) {
          ok += bos ? 0 : 1;
        } else {
          MESSAGE(name << (bos ? " (with BOS)" : "") << " round trip differs for '" << escape(c.text) << "': '"
                       << escape(whole) << "'");
        }
        CHECK(whole == c.text);
      }
    }
    MESSAGE(name << ": " << ok << "/" << cases.size() << " texts round-trip exactly");
  }
}

TEST_CASE("streaming detokenizer holds back partial UTF-8 from SPM byte-fallback tokens") {
  const Tokenizer* tok = vocab("llama-spm");
  if (!tok) return;
  const std::string text = "Emoji 🦙🚀😶‍🌫️ and CJK 我想在apple工作1314151天～ done";
  auto ids = tok->encode(text, true, false);
  int byte_tokens = 0;
  for (int32_t id : ids) byte_tokens += tok->token_type(id) == TokenType::Byte;
  CHECK(byte_tokens >= 8);  // the emoji are not in the Llama-2 vocab
  int held = 0;
  CHECK(stream(*tok, ids, &held) == text);
  CHECK(held >= 4);  // leading bytes of multi-byte characters were held back
  CHECK(tok->decode(ids) == text);

  // Invalid and truncated sequences.
  const int32_t e6 = tok->token_id("<0xE6>"), x88 = tok->token_id("<0x88>"), ff = tok->token_id("<0xFF>");
  const int32_t f0 = tok->token_id("<0xF0>"), x9f = tok->token_id("<0x9F>");
  const int32_t a = tok->token_id("a");
  REQUIRE((e6 >= 0 && x88 >= 0 && ff >= 0 && f0 >= 0 && x9f >= 0 && a >= 0));
  Detokenizer d(*tok);
  CHECK(d.feed(a) == "a");
  CHECK(d.feed(e6).empty());
  CHECK(d.feed(x88).empty());
  CHECK(d.feed(a) == "\xEF\xBF\xBD" "a");  // E6 88 then 'a': one replacement for the subpart
  CHECK(d.feed(ff) == "\xEF\xBF\xBD");      // never valid: replaced at once
  CHECK(d.feed(f0).empty());
  CHECK(d.feed(x9f).empty());
  CHECK(d.flush() == "\xEF\xBF\xBD");       // truncated at the end
  CHECK(d.flush().empty());

  CHECK(sanitize_utf8("ok \xC0\xAF x") == "ok \xEF\xBF\xBD\xEF\xBF\xBD x");  // overlong
  CHECK(sanitize_utf8("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  CHECK(sanitize_utf8("\xF4\x90\x80\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // > U+10FFFF
  CHECK(sanitize_utf8("\xF0\x9F\x98" "A") == "\xEF\xBF\xBD" "A");
  CHECK(sanitize_utf8("héllo 😀") == "héllo 😀");
}

TEST_CASE("SPM: dummy prefix, BOS, pieces and special ids") {
  const Tokenizer* tok = vocab("llama-spm");
  if (!tok) return;
  CHECK(tok->kind() == "llama (SentencePiece)");
  CHECK(tok->n_vocab() == 32000);
  CHECK(tok->bos() == 1);
  CHECK(tok->eos() == 2);
  CHECK(tok->unk() == 0);
  CHECK(tok->eot() == -1);
  CHECK(tok->add_bos_default());
  CHECK(tok->is_end_of_generation(2));
  CHECK_FALSE(tok->is_end_of_generation(1));
  CHECK(tok->token_to_piece(1).empty());
  CHECK(tok->token_to_piece(1, true) == "<s>");
  CHECK(tok->token_to_piece(tok->token_id("<0x41>")) == "A");
  CHECK(tok->token_to_piece(tok->token_id("▁Hello")) == " Hello");
  CHECK(tok->token_text(tok->token_id("▁Hello")) == "▁Hello");
  CHECK(tok->token_to_piece(-5).empty());
  CHECK(tok->token_to_piece(1 << 30).empty());
  CHECK(tok->token_text(32000).empty());

  auto ids = tok->encode("Hello world", true, false);
  REQUIRE(ids.size() == 3);
  CHECK(ids[0] == 1);
  CHECK(tok->token_text(ids[1]) == "▁Hello");
  CHECK(tok->decode(ids) == "Hello world");
  CHECK(tok->decode(ids, /*special=*/true) == "<s> Hello world");
  CHECK(tok->encode("", true, false) == std::vector<int32_t>{1});
  CHECK(tok->encode("", false, false).empty());

  // parse_special: "<s>" is BOS only when asked; the dummy prefix follows special tokens.
  CHECK(tok->encode("<s>", false, true) == std::vector<int32_t>{1});
  auto plain = tok->encode("<s>", false, false);
  CHECK(plain.size() > 1);
  CHECK(std::find(plain.begin(), plain.end(), 1) == plain.end());
  CHECK(tok->decode(plain) == "<s>");
  auto mixed = tok->encode("Hi</s>there", false, true);
  REQUIRE(mixed.size() >= 3);
  CHECK(std::find(mixed.begin(), mixed.end(), 2) != mixed.end());
  CHECK(tok->token_text(mixed.back()).starts_with("▁"));  // "▁there" after the special token
}

TEST_CASE("BPE: parse_special, user-defined tokens and special ids") {
  const Tokenizer* llama = vocab("llama-bpe");
  if (llama) {
    CHECK(llama->kind() == "gpt2 (byte-level BPE, pre=llama-bpe)");
    CHECK(llama->n_vocab() == 128256);
    CHECK(llama->bos() == 128000);
    CHECK(llama->eos() == 128001);
    CHECK(llama->eot() == 128009);
    CHECK(llama->eom() == -1);  // Llama 3.0: 128008 is a reserved token
    CHECK(llama->add_bos_default());
    for (int32_t id : {128001, 128009}) CHECK(llama->is_end_of_generation(id));
    CHECK_FALSE(llama->is_end_of_generation(128000));
    CHECK_FALSE(llama->is_end_of_generation(-1));

    CHECK(llama->encode("<|eot_id|>", false, true) == std::vector<int32_t>{128009});
    auto plain = llama->encode("<|eot_id|>", false, false);
    CHECK(plain.size() > 1);
    CHECK(llama->decode(plain) == "<|eot_id|>");
    auto chat = llama->encode("<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>", true, true);
    REQUIRE(chat.size() >= 6);
    CHECK(chat[0] == 128000);
    CHECK(chat[1] == 128006);
    CHECK(chat.back() == 128009);
    CHECK(llama->decode(chat) == "user\n\nHi!");  // control tokens render as nothing...
    CHECK(llama->decode(chat, true) == "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>");
    CHECK(llama->token_to_piece(llama->token_id("Ġworld")) == " world");
  }
  const Tokenizer* qwen = vocab("qwen2");
  if (qwen) {
    CHECK(qwen->kind() == "gpt2 (byte-level BPE, pre=qwen2)");
    CHECK_FALSE(qwen->add_bos_default());
    CHECK(qwen->eot() == 151645);  // <|im_end|>
    CHECK(qwen->is_end_of_generation(151645));
    CHECK(qwen->is_end_of_generation(151643));
    CHECK(qwen->encode("<|im_start|>", false, true) == std::vector<int32_t>{151644});
    CHECK(qwen->encode("<|im_start|>", false, false).size() > 1);
    // User-defined (non-special) added tokens are matched even without parse_special, like llama.cpp.
    CHECK(qwen->token_type(151667) == TokenType::UserDefined);
    CHECK(qwen->encode("<think>", false, false) == std::vector<int32_t>{151667});
    CHECK(qwen->token_to_piece(151667) == "<think>");
    CHECK(qwen->encode("123", false, false).size() == 3);  // single digits
  }
}

TEST_CASE("Phi-3: special tokens swallow the whitespace after them (llama.cpp's rstrip for Phi-3)") {
  const Tokenizer* tok = vocab("phi-3");
  if (!tok) return;
  const int32_t user = tok->token_id("<|user|>"), end = tok->token_id("<|end|>");
  const int32_t assistant = tok->token_id("<|assistant|>"), eot = tok->token_id("<|endoftext|>");
  const int32_t hello = tok->token_id("▁Hello"), a = tok->token_id("▁a");
  const int32_t b = tok->token_id("▁b"), newline = tok->token_id("<0x0A>");
  REQUIRE((user > 0 && end > 0 && assistant > 0 && eot > 0 && hello > 0 && a > 0 && b > 0 && newline > 0));
  // The Phi-3 template's newlines after <|user|>, <|end|> and <|assistant|> go with the tokens.
  CHECK(tok->encode("<|user|>\nHello<|end|>\n<|assistant|>\n", true, true) ==
        std::vector<int32_t>{1, user, hello, end, assistant});
  // </s> is user-defined in this vocab: split out (and stripping) even without parse_special.
  CHECK(tok->encode("a</s>  \n b", false, false) == std::vector<int32_t>{a, 2, b});
  // <|endoftext|>, <s> and <unk> keep what follows.
  auto kept = tok->encode("<|endoftext|>\nb", false, true);
  REQUIRE(kept.size() >= 2);
  CHECK(kept[0] == eot);
  CHECK(std::find(kept.begin(), kept.end(), newline) != kept.end());
  // Other vocabularies have no such rule: Llama 2's keeps the newline after </s>.
  const Tokenizer* llama = vocab("llama-spm");
  if (llama) {
    auto ids = llama->encode("a</s>\nb", false, true);
    CHECK(std::find(ids.begin(), ids.end(), llama->token_id("<0x0A>")) != ids.end());
  }
}

TEST_CASE("encode never crashes and byte-level/byte-fallback tokenization is lossless on arbitrary bytes") {
  std::mt19937 rng(1234);
  for (const std::string& name : kAllVocabs) {
    const Tokenizer* tok = vocab(name);
    if (!tok) continue;
    CAPTURE(name);
    // Bytes the vocab spells on their own. Some byte-level vocabs cannot spell every byte: falcon, mpt,
    // starcoder and refact have no piece for 0xC0, 0xC1, 0xF5.. (never in valid UTF-8; falcon neither
    // for some control bytes), and deepseek's spell those as user-defined tokens whose text is the
    // character, not the byte (so does llama.cpp). Text made of spellable bytes and valid UTF-8 is
    // still lossless there.
    std::array<bool, 256> spellable{};
    for (int b = 0; b < 256; ++b) {
      const std::string one(1, char(b));
      spellable[size_t(b)] = raw_pieces(*tok, tok->encode(one, false, false)) == one;
    }
    const bool every_byte = std::all_of(spellable.begin(), spellable.end(), [](bool x) { return x; });
    if (!every_byte) MESSAGE(name << ": " << std::count(spellable.begin(), spellable.end(), false) << " bytes not spellable alone");
    for (int iter = 0; iter < 200; ++iter) {
      std::string s;
      const int len = static_cast<int>(rng() % 64);
      for (int k = 0; k < len; ++k) {
        switch (rng() % 6) {
          case 0: s += char(rng() % 256); break;                        // any byte
          case 1: s += " \n\t\r"[rng() % 4]; break;
          case 2: s += "é我😀'"[rng() % 8]; break;                      // bytes of multi-byte chars
          case 3: s += iter % 2 ? "<|eot_id|>" : "<s>"; break;
          default: s += char('a' + rng() % 26); break;
        }
      }
      if (s.find("\xE2\x96\x81") != std::string::npos) continue;  // SPM turns U+2581 into a space
      for (bool special : {false, true}) {
        auto ids = tok->encode(s, false, special);
        for (int32_t id : ids) REQUIRE((id >= 0 && id < tok->n_vocab()));
        const bool lossless = every_byte || (is_valid_utf8(s) && std::all_of(s.begin(), s.end(), [&](char c) {
                                return spellable[uint8_t(c)];
                              }));
        if (!special && lossless) CHECK(raw_pieces(*tok, ids) == s);
        std::string streamed = stream(*tok, ids);
        CHECK(streamed == tok->decode(ids));
      }
    }
  }
}

TEST_CASE("pathological inputs: long runs of spaces, digits, one letter") {
  for (const std::string& name : kAllVocabs) {
    const Tokenizer* tok = vocab(name);
    if (!tok) continue;
    for (const std::string& s : {std::string(100000, ' ') + "a", std::string(50000, '7'),
                                 std::string(100000, 'x'), std::string(20000, '\n') + " \t "}) {
      const auto t0 = Clock::now();
      auto ids = tok->encode(s, false, false);
      const double ms = ms_since(t0);
      CHECK(raw_pieces(*tok, ids) == s);
      CHECK(ms < 5000);
      MESSAGE(name << ": " << s.size() << " bytes of '" << escape(s.substr(0, 1)) << "'... → " << ids.size()
                   << " tokens in " << ms << " ms");
    }
  }
}

TEST_CASE("stories260K: SentencePiece ids equal llama.cpp's for the reference passage") {
  auto model = test::shared_file("models/stories260K.gguf");
  auto ids_path = test::shared_file("reference/stories260K.passage.ids");
  auto text_path = test::shared_file("reference/stories260K.passage.txt");
  if (model.empty() || ids_path.empty() || text_path.empty()) return;
  auto f = GgufFile::open(model.string());
  REQUIRE_MESSAGE(f.ok(), f.error());
  auto tok = Tokenizer::from_gguf(**f);
  REQUIRE_MESSAGE(tok.ok(), tok.error());
  CHECK((*tok)->bos() == 1);  // no bos/eos keys in this file: llama.cpp's SPM defaults
  CHECK((*tok)->eos() == 2);
  std::vector<int32_t> expected;
  {
    std::ifstream in(ids_path);
    for (int32_t x; in >> x;) expected.push_back(x);
  }
  const std::string text = slurp(text_path);
  auto ids = (*tok)->encode(text, true, false);
  CHECK(ids == expected);
  CHECK((*tok)->decode(ids) == text);
}

TEST_CASE("throughput on the TinyStories corpus") {
  auto corpus = test::shared_file("corpora/tinystories_val_subset.txt");
  if (corpus.empty()) return;
  const std::string text = slurp(corpus);
  for (const std::string& name : kAllVocabs) {
    const Tokenizer* tok = vocab(name);
    if (!tok) continue;
    const auto t0 = Clock::now();
    auto ids = tok->encode(text, true, false);
    const double enc = ms_since(t0);
    const auto t1 = Clock::now();
    std::string back = tok->decode(ids);
    const double dec = ms_since(t1);
    CHECK(back == text);
    MESSAGE(name << ": " << text.size() / 1024 << " KiB → " << ids.size() << " tokens, encode " << enc
                 << " ms (" << text.size() / 1e3 / enc << " MB/s), decode " << dec << " ms");
  }
}

// ------------------------------------------------------------------------------ malformed vocabularies

namespace {

// A small valid SentencePiece vocabulary; tests break one thing at a time.
struct MiniVocab {
  std::string model = "llama";
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab"};
  std::vector<float> scores = {0, 0, 0, -1, -2, -3, -1.5f, -0.5f};
  std::vector<int32_t> types = {2, 3, 3, 1, 1, 1, 1, 1};
  std::vector<std::string> merges;  // gpt2 only
  std::optional<std::string> pre;
  int64_t bos = 1;
  bool write_types = true, write_tokens = true, write_merges = true;
  std::optional<bool> add_bos;
  std::optional<std::string> tmpl;

  Result<std::unique_ptr<Tokenizer>> load(std::vector<uint8_t>& storage) const {
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    if (!model.empty()) w.set_string("tokenizer.ggml.model", model);
    if (write_tokens) w.set_string_array("tokenizer.ggml.tokens", tokens);
    if (!scores.empty()) w.set_f32_array("tokenizer.ggml.scores", scores);
    if (write_types) w.set_i32_array("tokenizer.ggml.token_type", types);
    if (model == "gpt2" && write_merges) w.set_string_array("tokenizer.ggml.merges", merges);
    if (pre) w.set_string("tokenizer.ggml.pre", *pre);
    if (bos >= 0) w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(bos));
    w.set_u32("tokenizer.ggml.eos_token_id", 2);
    if (add_bos) w.set_bool("tokenizer.ggml.add_bos_token", *add_bos);
    if (tmpl) w.set_string("tokenizer.chat_template", *tmpl);
    storage = w.to_bytes();
    auto f = GgufFile::from_memory(storage.data(), storage.size());
    REQUIRE_MESSAGE(f.ok(), f.error());
    return Tokenizer::from_gguf(**f);
  }
};

void expect_error(const MiniVocab& v, const std::string& needle) {
  std::vector<uint8_t> storage;
  auto t = v.load(storage);
  REQUIRE_FALSE(t.ok());
  MESSAGE("error: " << t.error());
  CHECK_MESSAGE(t.error().find(needle) != std::string::npos, "'" << needle << "' not in: " << t.error());
}

}  // namespace

TEST_CASE("a minimal valid vocabulary loads and tokenizes") {
  MiniVocab v;
  v.tmpl = "{{ messages }}";
  std::vector<uint8_t> storage;
  auto t = v.load(storage);
  REQUIRE_MESSAGE(t.ok(), t.error());
  const Tokenizer& tok = **t;
  CHECK(tok.chat_template() == "{{ messages }}");
  CHECK(tok.encode("ab a", true, false) == std::vector<int32_t>{1, 3, 7, 6});
  // No byte tokens: unknown characters fall back to <unk>.
  CHECK(tok.encode("a\xC3\xA9", false, false) == std::vector<int32_t>{6, 0});
  CHECK(tok.decode(tok.encode("ab a", true, false)) == "ab a");
}

TEST_CASE("malformed vocabularies give errors naming the problem") {
  { MiniVocab v; v.types.pop_back(); expect_error(v, "tokenizer.ggml.token_type has 7 entries"); }
  { MiniVocab v; v.scores.push_back(0); expect_error(v, "tokenizer.ggml.scores has 9 entries"); }
  { MiniVocab v; v.bos = 8; expect_error(v, "tokenizer.ggml.bos_token_id = 8 is out of range"); }
  { MiniVocab v; v.model = "bert"; expect_error(v, "unsupported tokenizer.ggml.model 'bert'"); }
  { MiniVocab v; v.model = ""; expect_error(v, "no tokenizer.ggml.model"); }
  { MiniVocab v; v.write_tokens = false; expect_error(v, "no tokenizer.ggml.tokens"); }
  { MiniVocab v; v.tokens = {}; v.scores = {}; v.types = {}; expect_error(v, "tokenizer.ggml.tokens is empty"); }
  { MiniVocab v; v.tokens[5] = "a"; expect_error(v, "duplicate token 'a'"); }
  { MiniVocab v; v.types[4] = 9; expect_error(v, "token_type[4] = 9"); }
  {
    MiniVocab v;
    v.model = "gpt2";
    v.pre = "no-such-pre";
    expect_error(v, "unsupported tokenizer.ggml.pre 'no-such-pre'");
    for (const char* name : {"llama-bpe", "qwen2", "qwen3", "gpt-2", "starcoder", "smollm", "command-r", "tekken",
                             "deepseek-llm", "deepseek-coder", "falcon", "mpt", "refact"}) {
      expect_error(v, name);  // the message lists what is supported
    }
  }
  { MiniVocab v; v.model = "gpt2"; v.pre = "qwen2"; v.write_merges = false; expect_error(v, "tokenizer.ggml.merges"); }
  {
    MiniVocab v;
    v.model = "gpt2";
    v.pre = "qwen2";
    v.merges = {"a b", "nospace"};
    expect_error(v, "tokenizer.ggml.merges[1]");
  }
  {
    MiniVocab v;
    v.bos = -1;
    v.tokens[1] = "<bos>";  // no SPM default either
    v.add_bos = true;
    expect_error(v, "add_bos_token is true but there is no BOS");
  }
}

TEST_CASE("odd but valid vocabularies: none ids, gpt2 without pre, merges of unknown pieces") {
  {
    MiniVocab v;
    v.bos = 0xFFFFFFFFLL;  // "none", as some converters write
    std::vector<uint8_t> storage;
    auto t = v.load(storage);
    REQUIRE_MESSAGE(t.ok(), t.error());
    CHECK((*t)->bos() == -1);
    CHECK_FALSE((*t)->add_bos_default());
    CHECK((*t)->encode("a", true, false) == std::vector<int32_t>{6});
  }
  {
    MiniVocab v;
    v.model = "gpt2";
    v.tokens = {"a", "b", "ab", "Ġ", "Ġa", "<|endoftext|>"};
    v.scores = {};
    v.types = {1, 1, 1, 1, 1, 3};
    v.merges = {"a b", "Ġ a", "zz q"};
    v.bos = 5;
    std::vector<uint8_t> storage;
    auto t = v.load(storage);
    REQUIRE_MESSAGE(t.ok(), t.error());
    CHECK((*t)->kind() == "gpt2 (byte-level BPE, pre=llama-bpe, assumed: tokenizer.ggml.pre missing)");
    CHECK((*t)->encode("ab a", false, false) == std::vector<int32_t>{2, 4});
    CHECK((*t)->is_end_of_generation(5));
    // Characters without a byte token are dropped (the vocab cannot express them), without crashing.
    CHECK((*t)->encode("abc", false, false) == std::vector<int32_t>{2});
  }
}
