// Pre-tokenizers without a vocab in shared/ (tekken, smollm, command-r), checked word by word against a
// second regex engine (tests/reference/pretokenizers: Python's `regex` running the rules llama.cpp
// lists), the pre-tokenizer table's names and errors, byte-level vocabularies of those pre-tokenizers,
// and SentencePiece as Gemma's files use it (no dummy prefix, whitespace runs, byte fallback).
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/gguf/gguf.h"
#include "engine/text/pretokenizer.h"
#include "engine/text/tokenizer.h"
#include "test_support.h"
#include "token_pieces.h"

using namespace towers;

namespace {

const std::filesystem::path kReferenceDir = TOWERS_PRETOKENIZER_REFERENCE_DIR;

std::vector<std::string> words_of(const PreTokenizer& pt, const std::string& text) {
  std::vector<std::string> out;
  for (const auto& w : pt.split(text)) out.push_back(text.substr(w.offset, w.length));
  return out;
}

std::string joined(const std::vector<std::string>& words) {
  std::string s;
  for (const auto& w : words) s += "[" + w + "]";
  return s;
}

}  // namespace

TEST_CASE("pre-tokenizer words equal the reference regex engine's (tekken, smollm, command-r, ...)") {
  std::ifstream in(kReferenceDir / "splits.json");
  REQUIRE_MESSAGE(in.good(), "tests/reference/pretokenizers/splits.json missing (run split.py there)");
  const auto ref = nlohmann::json::parse(in);
  int compared = 0;
  for (const auto& split : ref.at("splits").items()) {  // not a structured binding: CHECK_MESSAGE (clang 14)
    const std::string& name = split.key();
    const auto& cases = split.value();
    auto pt = PreTokenizer::create(name);
    REQUIRE_MESSAGE(pt.ok(), pt.error());
    for (const auto& c : cases) {
      const std::string text = c.at("text");
      const auto expected = c.at("words").get<std::vector<std::string>>();
      const auto got = words_of(*pt, text);
      CHECK_MESSAGE(got == expected, name << ": '" << text << "'\n  expected " << joined(expected) << "\n  got      "
                                          << joined(got));
      ++compared;
    }
  }
  CHECK(compared >= 6 * 18);
  MESSAGE(compared << " texts split as the reference splits them");
}

TEST_CASE("tekken: case changes split words (also outside ASCII), digits one by one, marks stay with letters") {
  auto pt = PreTokenizer::create("tekken");
  REQUIRE_MESSAGE(pt.ok(), pt.error());
  CHECK(pt->ignore_merges());
  CHECK(pt->bos_by_default());
  using V = std::vector<std::string>;
  CHECK(words_of(*pt, "HelloWorld") == V{"Hello", "World"});
  CHECK(words_of(*pt, "HTTPServer") == V{"HTTPServer"});  // capitals, then lower case: one word
  CHECK(words_of(*pt, "ÉcoleÉté") == V{"École", "Été"});   // llama.cpp's ASCII adaptation keeps one word
  CHECK(words_of(*pt, "cafe\u0301s") == V{"cafe\u0301s"});
  CHECK(words_of(*pt, "2024") == V{"2", "0", "2", "4"});
  CHECK(words_of(*pt, "x?!\n\ny") == V{"x", "?!\n\n", "y"});
  CHECK(words_of(*pt, "a/b//\n") == V{"a", "/b", "//\n"});
  CHECK(words_of(*pt, "a  b") == V{"a", " ", " b"});
}

TEST_CASE("smollm, command-r, starcoder: digits alone, then GPT-2's words") {
  using V = std::vector<std::string>;
  for (const char* name : {"smollm", "command-r", "starcoder", "refact"}) {
    auto pt = PreTokenizer::create(name);
    REQUIRE_MESSAGE(pt.ok(), pt.error());
    CHECK(pt->name() == "starcoder");
    CHECK_FALSE(pt->ignore_merges());
    CHECK_FALSE(pt->bos_by_default());
    CHECK(words_of(*pt, "I'm 42!") == V{"I", "'m", " ", "4", "2", "!"});
    CHECK(words_of(*pt, "HelloWorld  x\n") == V{"HelloWorld", " ", " x", "\n"});
  }
}

TEST_CASE("the table: aliases, qwen3 = qwen2, unknown names listed") {
  for (const char* alias : {"qwen3", "deepseek-r1-qwen", "qwen2"}) {
    auto pt = PreTokenizer::create(alias);
    REQUIRE_MESSAGE(pt.ok(), pt.error());
    CHECK(pt->name() == "qwen2");
  }
  for (const char* alias : {"llama3", "llama-v3", "llama-bpe"}) {
    auto pt = PreTokenizer::create(alias);
    REQUIRE_MESSAGE(pt.ok(), pt.error());
    CHECK(pt->name() == "llama-bpe");
    CHECK(pt->ignore_merges());
  }
  auto mpt = PreTokenizer::create("mpt");
  REQUIRE(mpt.ok());
  CHECK(mpt->name() == "gpt-2");
  auto bad = PreTokenizer::create("chameleon");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().find("'chameleon'") != std::string::npos);
  CHECK(bad.error().find(PreTokenizer::supported_names()) != std::string::npos);
  // Words always cover the text, invalid UTF-8 included.
  auto tek = PreTokenizer::create("tekken");
  REQUIRE(tek.ok());
  const std::string junk = "a\xFF\xC3 b\xE2\x82";
  std::string back;
  for (const auto& w : words_of(*tek, junk)) back += w;
  CHECK(back == junk);
  CHECK(tek->split("").empty());
}

// ------------------------------------------------------------------- byte-level vocabs of these names

namespace {

// A GGUF tokenizer from tokens (types normal unless given) and merges.
struct VocabFile {
  std::vector<uint8_t> bytes;
  std::shared_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
};

VocabFile make_vocab(const std::string& model, const std::vector<std::string>& tokens, const std::vector<float>& scores,
                     const std::vector<int32_t>& types, const std::vector<std::string>& merges,
                     const std::function<void(GgufWriter&)>& more) {
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", model);
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  if (!scores.empty()) w.set_f32_array("tokenizer.ggml.scores", scores);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  if (!merges.empty()) w.set_string_array("tokenizer.ggml.merges", merges);
  more(w);
  VocabFile v;
  v.bytes = w.to_bytes();
  auto f = GgufFile::from_memory(v.bytes.data(), v.bytes.size());
  REQUIRE_MESSAGE(f.ok(), f.error());
  v.file = f.value();
  auto t = Tokenizer::from_gguf(*v.file);
  REQUIRE_MESSAGE(t.ok(), t.error());
  v.tok = std::move(t.value());
  return v;
}

}  // namespace

TEST_CASE("a tekken vocab: BOS by default, whole-word tokens without merges, case splits") {
  // Byte-level pieces: "Ġ" is the space byte.
  const std::vector<std::string> tokens = {"<s>", "</s>", "H", "e", "l", "o", "W", "r", "d", "Ġ", "Hello", "World", "ĠWorld"};
  std::vector<int32_t> types(tokens.size(), 1);
  types[0] = types[1] = 3;
  auto v = make_vocab("gpt2", tokens, {}, types, {"H e"}, [](GgufWriter& w) {
    w.set_string("general.architecture", "llama");
    w.set_string("tokenizer.ggml.pre", "tekken");
    w.set_u32("tokenizer.ggml.bos_token_id", 0);
    w.set_u32("tokenizer.ggml.eos_token_id", 1);
  });
  const Tokenizer& tok = *v.tok;
  CHECK(tok.kind() == "gpt2 (byte-level BPE, pre=tekken)");
  CHECK(tok.add_bos_default());
  // "Hello" and "World" are tokens: taken whole although no merge builds them (ignore_merges); the
  // case change splits "HelloWorld" into the two words first.
  CHECK(tok.encode("HelloWorld", true, false) == std::vector<int32_t>{0, 10, 11});
  CHECK(tok.encode("Hello World", false, false) == std::vector<int32_t>{10, 12});
  // Not a token: merged by the merges, then left in pieces.
  CHECK(tok.encode("Held", false, false) == std::vector<int32_t>{2, 3, 4, 8});
  CHECK(tok.decode(tok.encode("Hello World", false, false)) == "Hello World");
}

TEST_CASE("a smollm vocab: no BOS unless the file says so, digits one by one") {
  const std::vector<std::string> tokens = {"<|endoftext|>", "1", "2", "12", "a", "b", "ab", "Ġ", "Ġab"};
  std::vector<int32_t> types(tokens.size(), 1);
  types[0] = 3;
  auto v = make_vocab("gpt2", tokens, {}, types, {"1 2", "a b", "Ġ ab"}, [](GgufWriter& w) {
    w.set_string("general.architecture", "llama");
    w.set_string("tokenizer.ggml.pre", "smollm");
    w.set_u32("tokenizer.ggml.bos_token_id", 0);
    w.set_u32("tokenizer.ggml.eos_token_id", 0);
  });
  CHECK_FALSE(v.tok->add_bos_default());
  CHECK(v.tok->encode("12 ab", false, false) == std::vector<int32_t>{1, 2, 8});  // "12" is never one word
  CHECK(v.tok->encode("ab", false, false) == std::vector<int32_t>{6});
}

// ---------------------------------------------------------------------------- SentencePiece, Gemma's way

TEST_CASE("Gemma-style SentencePiece: no dummy prefix, space and newline runs, byte fallback") {
  // Gemma's GGUFs: tokenizer.ggml.model "llama", add_space_prefix false, <pad> <eos> <bos> <unk> first,
  // byte tokens <0x00>..<0xFF>, pieces for runs of spaces and newlines, <start_of_turn> user-defined.
  std::vector<std::string> tokens = {"<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"};
  std::vector<int32_t> types = {3, 3, 3, 2, 4, 4};
  std::vector<float> scores(tokens.size(), 0.0f);
  const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
    types.push_back(6);
    scores.push_back(0.0f);
  }
  const int32_t byte0 = 6;
  auto add = [&](const std::string& piece, float score) {
    tokens.push_back(piece);
    types.push_back(1);
    scores.push_back(score);
    return static_cast<int32_t>(tokens.size() - 1);
  };
  // Merges go to the highest-scoring piece first (SentencePiece BPE): "ll" (-4) before "llo" (-3)
  // can form, "He" (-5) then "Hello" (-1); "▁w" (-6), "or" (-7), "▁wor" (-2), "ld" (-8), "▁world" (-1.5).
  for (const char* c : {"H", "e", "l", "o", "w", "r", "d", "a", "b", "u", "s", "\n"}) add(c, -10);
  add("\xE2\x96\x81", -9);  // "▁"
  add("He", -5);
  add("ll", -4);
  add("llo", -3);
  const int32_t hello = add("Hello", -1);
  add("\xE2\x96\x81w", -6);
  add("or", -7);
  add("\xE2\x96\x81wor", -2);
  add("ld", -8);
  const int32_t world = add("\xE2\x96\x81world", -1.5f);
  const int32_t sp2 = add("\xE2\x96\x81\xE2\x96\x81", -3);
  const int32_t sp4 = add("\xE2\x96\x81\xE2\x96\x81\xE2\x96\x81\xE2\x96\x81", -2);
  const int32_t nl2 = add("\n\n", -3);
  add("us", -6);
  add("er", -6);
  const int32_t user = add("user", -2);  // from "us" + "er"
  auto v = make_vocab("llama", tokens, scores, types, {}, [](GgufWriter& w) {
    w.set_string("general.architecture", "gemma2");
    w.set_u32("tokenizer.ggml.bos_token_id", 2);
    w.set_u32("tokenizer.ggml.eos_token_id", 1);
    w.set_u32("tokenizer.ggml.unknown_token_id", 3);
    w.set_u32("tokenizer.ggml.padding_token_id", 0);
    w.set_bool("tokenizer.ggml.add_bos_token", true);
    w.set_bool("tokenizer.ggml.add_space_prefix", false);
  });
  const Tokenizer& tok = *v.tok;
  auto id = [&](const std::string& t) { return tok.token_id(t); };
  CHECK(tok.add_bos_default());
  CHECK_FALSE(tok.strips_leading_space());
  // No "▁" in front of the first word (Llama-2's SentencePiece would write "▁Hello").
  CHECK(tok.encode("Hello world", true, false) == std::vector<int32_t>{2, hello, world});
  // Four spaces: the leftmost of the equal "▁▁" pairs first, then the two merge into "▁▁▁▁".
  CHECK(tok.encode("a    b", false, false) == std::vector<int32_t>{id("a"), sp4, id("b")});
  CHECK(tok.encode("   a", false, false) == std::vector<int32_t>{sp2, id("\xE2\x96\x81"), id("a")});
  CHECK(tok.encode("a\n\nb\n", false, false) == std::vector<int32_t>{id("a"), nl2, id("b"), id("\n")});
  // Byte fallback for what the vocab lacks.
  CHECK(tok.encode("aé", false, false) == std::vector<int32_t>{id("a"), byte0 + 0xC3, byte0 + 0xA9});
  // A user-defined token splits the text without parse_special, and no prefix space follows it.
  CHECK(tok.encode("<start_of_turn>user\n", false, false) == std::vector<int32_t>{4, user, id("\n")});
  // Decoding keeps leading spaces (no dummy prefix to drop) and is lossless.
  for (const std::string s : {"   a", "Hello world", "a    b\n\n", "<start_of_turn>user\nHi é 🦙<end_of_turn>\n"}) {
    const auto ids = tok.encode(s, true, false);
    CHECK(tok.decode(ids) == s);
    CHECK(test::raw_pieces(tok, ids) == s);
  }
}
