// SentencePiece and byte-level BPE tokenizers from GGUF metadata; see tokenizer.h.
// Behaviour follows llama.cpp's src/llama-vocab.cpp (llm_tokenizer_spm / llm_tokenizer_bpe,
// tokenizer_st_partition, token_to_piece); the code is our own.
#include "engine/text/tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <optional>
#include <queue>
#include <unordered_map>

#include "engine/text/pretokenizer.h"

namespace towers {

// ------------------------------------------------------------------------------------------ UTF-8

namespace {

// Length of the well-formed UTF-8 sequence at p (1..4); 0 when p[0..n) is a valid but truncated
// prefix; -k when the first k bytes are a maximal ill-formed subpart (Unicode Table 3-7).
int utf8_check(const uint8_t* p, size_t n) {
  const uint8_t b = p[0];
  if (b < 0x80) return 1;
  int len;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < len; ++k) {
    if (static_cast<size_t>(k) >= n) return 0;
    const uint8_t c = p[k];
    if (c < lo || c > hi) return -k;
    lo = 0x80;
    hi = 0xBF;
  }
  return len;
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
constexpr std::string_view kSpmSpace = "\xE2\x96\x81";    // U+2581 "▁"

// Appends the valid part of `in` to out (ill-formed subparts → U+FFFD). Returns the number of bytes
// consumed: everything when final, else up to a truncated sequence at the end (held back).
size_t utf8_drain(std::string_view in, std::string& out, bool final) {
  const auto* p = reinterpret_cast<const uint8_t*>(in.data());
  const size_t n = in.size();
  size_t i = 0, run = 0;  // [run, i) is valid and not yet copied
  while (i < n) {
    const int r = utf8_check(p + i, n - i);
    if (r > 0) {
      i += static_cast<size_t>(r);
      continue;
    }
    out.append(in.data() + run, i - run);
    if (r == 0) {
      if (!final) return i;
      out.append(kReplacement);
      return n;
    }
    out.append(kReplacement);
    i += static_cast<size_t>(-r);
    run = i;
  }
  out.append(in.data() + run, n - run);
  return n;
}

// Code point of a well-formed sequence of length len at p.
uint32_t utf8_decode(const uint8_t* p, int len) {
  switch (len) {
    case 1: return p[0];
    case 2: return (uint32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3: return (uint32_t(p[0] & 0x0F) << 12) | (uint32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
      return (uint32_t(p[0] & 0x07) << 18) | (uint32_t(p[1] & 0x3F) << 12) |
             (uint32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
  }
}

void utf8_append(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
}

// llama.cpp's unicode_len_utf8: the sequence length a lead byte announces (continuation bytes: 1).
size_t lead_len(uint8_t b) {
  static constexpr uint8_t kLookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLookup[b >> 4];
}

std::string hex_byte_token(uint8_t b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string{'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
}

// "<0xAB>" → 0xAB, else -1.
int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int h = hex(t[3]), l = hex(t[4]);
  return h < 0 || l < 0 ? -1 : h * 16 + l;
}

std::string_view type_name(GgufValueType t) { return gguf_value_type_name(t); }


}  // namespace

bool is_valid_utf8(std::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t i = 0;
  while (i < bytes.size()) {
    const int r = utf8_check(p + i, bytes.size() - i);
    if (r <= 0) return false;
    i += static_cast<size_t>(r);
  }
  return true;
}

std::string sanitize_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  utf8_drain(bytes, out, true);
  return out;
}

// ------------------------------------------------------------------------------------------ Impl

struct Tokenizer::Impl {
  enum class Model { Spm, Bpe };
  Model model = Model::Spm;
  std::string kind;
  std::string chat_template;

  std::vector<std::string> text;    // vocab strings
  std::vector<float> score;         // empty when the file has none
  std::vector<TokenType> type;
  std::vector<std::string> piece;   // bytes for token_to_piece(id, special=true)
  std::vector<uint8_t> eog;         // 1: end of generation
  std::unordered_map<std::string_view, int32_t> to_id;  // keys view into `text`

  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;
  bool add_bos = false, add_eos = false;
  bool add_space_prefix = true;  // SPM
  // SPM: every piece with a "▁" after its first character is made of "▁" only (true of Llama-2's
  // vocab), so no piece can cross the start of a "▁" that follows another character.
  bool spm_split_at_spaces = false;

  std::vector<int32_t> special;  // control / user-defined / unknown ids, longest text first
  // By id: the token swallows the whitespace after it in the input (llama.cpp's RSTRIP; Phi-3's
  // special tokens). Empty when no token does.
  std::vector<uint8_t> rstrip;

  // SPM byte fallback.
  std::array<int32_t, 256> byte_token{};

  // BPE.
  struct Merge {
    int32_t rank;
    int32_t result;  // id of the merged text, -1 when it is not in the vocab
  };
  std::unordered_map<uint64_t, Merge> merges;  // key: left id << 32 | right id
  bool ignore_merges = false;
  std::array<std::string, 256> byte_char;  // GPT-2 byte → printable code point (UTF-8)
  std::array<int16_t, 0x144> char_byte{};  // code point → byte, -1 when not a byte char
  std::optional<PreTokenizer> pretokenizer;

  int32_t lookup(std::string_view s) const {
    auto it = to_id.find(s);
    return it == to_id.end() ? -1 : it->second;
  }

  Status load(const GgufFile& f);
  Status load_bpe(const GgufFile& f, const std::string& where);
  void build_pieces();

  struct Fragment {
    int32_t token;  // >= 0: a special token; -1: text [off, off + len)
    size_t off, len;
  };
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;
  void encode_spm(std::string_view text, bool prefix_space, std::vector<int32_t>& out) const;
  void encode_spm_chunk(std::string_view s, std::vector<int32_t>& out) const;
  void encode_bpe(std::string_view text, std::vector<int32_t>& out) const;
  void bpe_word(std::string_view encoded, std::vector<int32_t>& out) const;
};

namespace {

Status bad(const std::string& where, const std::string& msg) {
  return Status::Error(where + "tokenizer: " + msg);
}

}  // namespace

namespace {

// Phi-3 and 3.5 files: llama.cpp recognises them by general.name ("phi-3", "phi3"); converters now
// write names such as "Phi 3.5 Mini Instruct", so a SentencePiece vocab of architecture phi3 counts too
// (Phi-4's is byte-level BPE and has no such rule).
bool is_phi3(const GgufFile& f) {
  auto str = [&](const char* key) {
    const GgufValue* v = f.find(key);
    std::string s = v && v->type == GgufValueType::STRING ? std::string(v->str) : std::string();
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string name = str("general.name");
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) return true;
  return str("general.architecture") == "phi3" && str("tokenizer.ggml.model") == "llama";
}

}  // namespace

Status Tokenizer::Impl::load(const GgufFile& f) {
  const std::string where = f.path().empty() ? std::string() : f.path() + ": ";

  // Model.
  const GgufValue* mv = f.find("tokenizer.ggml.model");
  if (!mv) return bad(where, "no tokenizer.ggml.model key (this GGUF has no tokenizer)");
  if (mv->type != GgufValueType::STRING) {
    return bad(where, "tokenizer.ggml.model has type " + std::string(type_name(mv->type)) +
                          ", expected string");
  }
  if (mv->str == "llama") {
    model = Model::Spm;
  } else if (mv->str == "gpt2") {
    model = Model::Bpe;
  } else {
    return bad(where, "unsupported tokenizer.ggml.model '" + std::string(mv->str) +
                          "' (supported: 'llama' = SentencePiece, 'gpt2' = byte-level BPE)");
  }

  // Tokens.
  const GgufValue* tv = f.find("tokenizer.ggml.tokens");
  if (!tv) return bad(where, "no tokenizer.ggml.tokens key");
  if (tv->type != GgufValueType::ARRAY || tv->elem_type != GgufValueType::STRING) {
    return bad(where, "tokenizer.ggml.tokens must be an array of strings");
  }
  if (tv->strings.empty()) return bad(where, "tokenizer.ggml.tokens is empty");
  if (tv->strings.size() > size_t(INT32_MAX / 2)) return bad(where, "tokenizer.ggml.tokens is too large");
  const auto n = static_cast<int32_t>(tv->strings.size());
  text.assign(tv->strings.begin(), tv->strings.end());

  // Scores.
  if (const GgufValue* sv = f.find("tokenizer.ggml.scores")) {
    auto s = f.get_f32_array("tokenizer.ggml.scores");
    if (sv->type != GgufValueType::ARRAY || !s) {
      return bad(where, "tokenizer.ggml.scores must be an array of numbers");
    }
    if (s->size() != size_t(n)) {
      return bad(where, "tokenizer.ggml.scores has " + std::to_string(s->size()) +
                            " entries but tokenizer.ggml.tokens has " + std::to_string(n));
    }
    score = std::move(*s);
  }

  // Token types.
  type.assign(size_t(n), TokenType::Normal);
  if (const GgufValue* yv = f.find("tokenizer.ggml.token_type")) {
    const bool int_elems = yv->type == GgufValueType::ARRAY &&
                           yv->elem_type != GgufValueType::STRING &&
                           yv->elem_type != GgufValueType::FLOAT32 &&
                           yv->elem_type != GgufValueType::FLOAT64 &&
                           yv->elem_type != GgufValueType::ARRAY;
    auto t = f.get_i32_array("tokenizer.ggml.token_type");
    if (!int_elems || !t) return bad(where, "tokenizer.ggml.token_type must be an array of integers");
    if (t->size() != size_t(n)) {
      return bad(where, "tokenizer.ggml.token_type has " + std::to_string(t->size()) +
                            " entries but tokenizer.ggml.tokens has " + std::to_string(n));
    }
    for (int32_t i = 0; i < n; ++i) {
      const int32_t v = (*t)[size_t(i)];
      if (v < 0 || v > 6) {
        return bad(where, "tokenizer.ggml.token_type[" + std::to_string(i) + "] = " + std::to_string(v) +
                              " is not a token type (0..6)");
      }
      type[size_t(i)] = static_cast<TokenType>(v);
    }
  }

  // Text → id.
  to_id.reserve(size_t(n) * 2);
  for (int32_t i = 0; i < n; ++i) {
    const std::string& s = text[size_t(i)];
    if (s.empty()) continue;  // cannot be matched; keeps its id
    auto [it, inserted] = to_id.emplace(std::string_view(s), i);
    if (!inserted) {
      return bad(where, "duplicate token '" + s + "' (ids " + std::to_string(it->second) + " and " +
                            std::to_string(i) + ") in tokenizer.ggml.tokens");
    }
  }

  // Special ids.
  auto read_id = [&](const char* key, int32_t& id, bool lenient) -> Status {
    const GgufValue* v = f.find(key);
    if (!v) return Status::Ok();
    if (!v->is_integer()) {
      return bad(where, std::string(key) + " has type " + std::string(type_name(v->type)) +
                            ", expected an integer token id");
    }
    const int64_t x = v->as_int();
    if (x < 0 || x == INT64_C(0xFFFFFFFF)) {  // -1 as int32 or uint32: "none"
      id = -1;
    } else if (x >= n) {
      if (!lenient) {
        return bad(where, std::string(key) + " = " + std::to_string(x) + " is out of range (the vocab has " +
                              std::to_string(n) + " tokens)");
      }
      id = -1;
    } else {
      id = static_cast<int32_t>(x);
    }
    return Status::Ok();
  };
  if (model == Model::Spm) {  // llama.cpp's defaults, when those slots hold the usual pieces
    if (n > 0 && text[0] == "<unk>") unk = 0;
    if (n > 1 && text[1] == "<s>") bos = 1;
    if (n > 2 && text[2] == "</s>") eos = 2;
  }
  for (auto [key, ref] : {std::pair<const char*, int32_t*>{"tokenizer.ggml.bos_token_id", &bos},
                          {"tokenizer.ggml.eos_token_id", &eos},
                          {"tokenizer.ggml.eot_token_id", &eot},
                          {"tokenizer.ggml.eom_token_id", &eom},
                          {"tokenizer.ggml.unknown_token_id", &unk}}) {
    if (Status s = read_id(key, *ref, false); !s.ok()) return s;
  }
  // A stray padding id must not stop a model from loading: it is not used for anything here.
  if (Status s = read_id("tokenizer.ggml.padding_token_id", pad, true); !s.ok()) return s;

  // Flags.
  auto read_bool = [&](const char* key, bool& out) -> Status {
    const GgufValue* v = f.find(key);
    if (!v) return Status::Ok();
    auto b = f.get_bool(key);
    if (!b) {
      return bad(where, std::string(key) + " has type " + std::string(type_name(v->type)) + ", expected bool");
    }
    out = *b;
    return Status::Ok();
  };

  if (model == Model::Spm) {
    add_bos = bos >= 0;
    add_space_prefix = true;
    kind = "llama (SentencePiece)";
  } else {
    if (Status s = load_bpe(f, where); !s.ok()) return s;
  }
  if (Status s = read_bool("tokenizer.ggml.add_bos_token", add_bos); !s.ok()) return s;
  if (Status s = read_bool("tokenizer.ggml.add_eos_token", add_eos); !s.ok()) return s;
  if (Status s = read_bool("tokenizer.ggml.add_space_prefix", add_space_prefix); !s.ok()) return s;
  if (model == Model::Bpe) add_space_prefix = false;  // not a BPE concept (llama.cpp ignores it too)
  if (add_bos && bos < 0) {
    if (f.find("tokenizer.ggml.add_bos_token")) {
      return bad(where, "tokenizer.ggml.add_bos_token is true but there is no BOS token "
                        "(tokenizer.ggml.bos_token_id)");
    }
    add_bos = false;
  }
  if (add_eos && eos < 0) {
    return bad(where, "tokenizer.ggml.add_eos_token is true but there is no EOS token "
                      "(tokenizer.ggml.eos_token_id)");
  }

  if (const GgufValue* cv = f.find("tokenizer.chat_template")) {
    if (cv->type != GgufValueType::STRING) {
      return bad(where, "tokenizer.chat_template has type " + std::string(type_name(cv->type)) +
                            ", expected string");
    }
    chat_template = std::string(cv->str);
  }

  // End of generation. Like llama.cpp, tokens with these texts count as control tokens.
  static constexpr std::string_view kEotTexts[] = {
      "<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", "<EOT>",
      "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",  // <｜end▁of▁sentence｜>
      "<|endoftext|>", "<|end_of_text|>"};
  static constexpr std::string_view kEogTexts[] = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
      "<|end_of_text|>", "<end_of_utterance>",
      "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"};
  if (eot < 0 && !f.find("tokenizer.ggml.eot_token_id")) {
    for (std::string_view t : kEotTexts) {
      const int32_t id = lookup(t);
      if (id >= 0 && id != eos) {
        eot = id;
        break;
      }
    }
  }
  if (eom < 0 && !f.find("tokenizer.ggml.eom_token_id")) eom = lookup("<|eom_id|>");
  eog.assign(size_t(n), 0);
  for (std::string_view t : kEogTexts) {
    const int32_t id = lookup(t);
    if (id >= 0) {
      eog[size_t(id)] = 1;
      if (type[size_t(id)] != TokenType::Control) type[size_t(id)] = TokenType::Control;
    }
  }
  for (int32_t id : {eos, eot, eom}) {
    if (id >= 0) eog[size_t(id)] = 1;
  }

  // Special tokens for partitioning the input, longest first.
  for (int32_t i = 0; i < n; ++i) {
    const TokenType t = type[size_t(i)];
    if ((t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown) &&
        !text[size_t(i)].empty()) {
      special.push_back(i);
    }
  }
  std::stable_sort(special.begin(), special.end(), [&](int32_t a, int32_t b) {
    return text[size_t(a)].size() > text[size_t(b)].size();
  });
  if (is_phi3(f)) {
    // As llama.cpp sets it for Phi-3 (from the rstrip flags of its tokenizer.json): every special
    // token but <unk>, <s> and <|endoftext|>, and </s>.
    rstrip.assign(size_t(n), 0);
    for (int32_t id : special) rstrip[size_t(id)] = 1;
    for (std::string_view t : {"<unk>", "<s>", "<|endoftext|>"}) {
      if (int32_t id = lookup(t); id >= 0) rstrip[size_t(id)] = 0;
    }
    if (int32_t id = lookup("</s>"); id >= 0) rstrip[size_t(id)] = 1;
  }

  // SPM byte fallback: <0xXX>, else the byte itself as a piece.
  for (int b = 0; b < 256; ++b) {
    int32_t id = lookup(hex_byte_token(uint8_t(b)));
    if (id < 0) id = lookup(std::string(1, char(b)));
    byte_token[size_t(b)] = id;
  }

  if (model == Model::Spm) {
    spm_split_at_spaces = true;
    for (const std::string& t : text) {
      if (t.find(kSpmSpace, 1) == std::string::npos) continue;
      for (size_t k = 0; k < t.size(); k += kSpmSpace.size()) {
        if (t.compare(k, kSpmSpace.size(), kSpmSpace) != 0) {
          spm_split_at_spaces = false;
          break;
        }
      }
      if (!spm_split_at_spaces) break;
    }
  }

  build_pieces();
  return Status::Ok();
}

Status Tokenizer::Impl::load_bpe(const GgufFile& f, const std::string& where) {
  // Pre-tokenizer.
  std::string pre_key;
  bool assumed = false;
  if (const GgufValue* pv = f.find("tokenizer.ggml.pre")) {
    if (pv->type != GgufValueType::STRING) {
      return bad(where, "tokenizer.ggml.pre has type " + std::string(type_name(pv->type)) + ", expected string");
    }
    pre_key = std::string(pv->str);
  } else {
    pre_key = "llama-bpe";
    assumed = true;
  }
  auto pt = PreTokenizer::create(pre_key);
  if (!pt.ok()) return bad(where, pt.error());
  pretokenizer.emplace(std::move(pt.value()));
  ignore_merges = pretokenizer->ignore_merges();
  add_bos = pretokenizer->bos_by_default();  // tokenizer.ggml.add_bos_token, read later, overrides it
  kind = "gpt2 (byte-level BPE, pre=" + pre_key + (assumed ? ", assumed: tokenizer.ggml.pre missing)" : ")");

  // Byte-level alphabet.
  char_byte.fill(-1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + extra++);
    byte_char[size_t(b)].clear();
    utf8_append(byte_char[size_t(b)], cp);
    char_byte[cp] = int16_t(b);
  }

  // Merges.
  const GgufValue* mv = f.find("tokenizer.ggml.merges");
  if (!mv) return bad(where, "no tokenizer.ggml.merges key (required for a gpt2 BPE vocab)");
  if (mv->type != GgufValueType::ARRAY || mv->elem_type != GgufValueType::STRING) {
    return bad(where, "tokenizer.ggml.merges must be an array of strings");
  }
  merges.reserve(mv->strings.size() * 2);
  std::string joined;
  for (size_t r = 0; r < mv->strings.size(); ++r) {
    std::string_view m = mv->strings[r];
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
    if (sp == std::string_view::npos) {
      return bad(where, "tokenizer.ggml.merges[" + std::to_string(r) + "] = '" + std::string(m) +
                            "' is not two pieces separated by a space");
    }
    const std::string_view a = m.substr(0, sp), b = m.substr(sp + 1);
    const int32_t ia = lookup(a), ib = lookup(b);
    if (ia < 0 || ib < 0) continue;  // a merge of non-tokens can never apply (see bpe_word)
    joined.assign(a);
    joined.append(b);
    const uint64_t key = (uint64_t(uint32_t(ia)) << 32) | uint32_t(ib);
    merges.try_emplace(key, Merge{static_cast<int32_t>(r), lookup(joined)});
  }
  return Status::Ok();
}

void Tokenizer::Impl::build_pieces() {
  const size_t n = text.size();
  piece.assign(n, std::string());
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = text[i];
    switch (type[i]) {
      case TokenType::Control:
      case TokenType::Unknown:
      case TokenType::UserDefined:
        piece[i] = t;
        break;
      case TokenType::Unused:
      case TokenType::Undefined:
        break;
      case TokenType::Byte:
        if (int b = parse_byte_token(t); b >= 0) {
          piece[i] = std::string(1, char(b));
          break;
        }
        [[fallthrough]];
      case TokenType::Normal:
        if (model == Model::Spm) {
          std::string& out = piece[i];
          size_t pos = 0;
          while (pos < t.size()) {
            const size_t hit = t.find(kSpmSpace, pos);
            if (hit == std::string::npos) {
              out.append(t, pos, std::string::npos);
              break;
            }
            out.append(t, pos, hit - pos);
            out += ' ';
            pos = hit + kSpmSpace.size();
          }
        } else {
          // Byte-level: each code point stands for one byte; others are kept as they are.
          std::string& out = piece[i];
          const auto* p = reinterpret_cast<const uint8_t*>(t.data());
          size_t k = 0;
          while (k < t.size()) {
            const int r = utf8_check(p + k, t.size() - k);
            if (r <= 0) {  // not valid UTF-8 in the vocab: copy the byte
              out += t[k++];
              continue;
            }
            const uint32_t cp = utf8_decode(p + k, r);
            if (cp < char_byte.size() && char_byte[cp] >= 0) {
              out += char(char_byte[cp]);
            } else {
              out.append(t, k, size_t(r));
            }
            k += size_t(r);
          }
        }
        break;
    }
  }
}

// Splits text on special-token texts like llama.cpp's tokenizer_st_partition: for each special token,
// longest first, every remaining text fragment is split at each of its occurrences.
std::vector<Tokenizer::Impl::Fragment> Tokenizer::Impl::partition(std::string_view text,
                                                                  bool parse_special) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  for (int32_t id : special) {
    const TokenType t = type[size_t(id)];
    if (!parse_special && t != TokenType::UserDefined) continue;
    const std::string_view st = this->text[size_t(id)];
    if (text.find(st) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& fr : frags) {
      if (fr.token >= 0) {
        next.push_back(fr);
        continue;
      }
      const size_t end = fr.off + fr.len;
      const std::string_view window = text.substr(0, end);
      size_t pos = fr.off;
      for (;;) {
        const size_t m = window.find(st, pos);
        if (m == std::string_view::npos) break;
        if (m > pos) next.push_back({-1, pos, m - pos});
        next.push_back({id, 0, 0});
        pos = m + st.size();
        if (!rstrip.empty() && rstrip[size_t(id)]) {
          while (pos < end && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
        }
      }
      if (pos < end) next.push_back({-1, pos, end - pos});
    }
    frags.swap(next);
  }
  return frags;
}

// ------------------------------------------------------------------------------------------ SPM

namespace {

// The merge loop SPM and BPE share: the symbols form a linked list, candidate bigrams a heap. The best
// bigram whose sides have not changed since it was queued merges its right symbol into its left (the
// right one keeps n = 0), and the merged symbol's new neighbour pairs are offered. `stale` says
// whether a bigram no longer matches its symbols; `merged` updates what else the left symbol carries.
template <class Symbol, class Queue, class Offer, class Stale, class Merged>
void merge_bigrams(std::vector<Symbol>& sym, Queue& queue, Offer offer, Stale stale, Merged merged) {
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) offer(i - 1, i);
  while (!queue.empty()) {
    const auto bg = queue.top();
    queue.pop();
    Symbol& l = sym[size_t(bg.left)];
    Symbol& r = sym[size_t(bg.right)];
    if (l.n == 0 || r.n == 0 || stale(l, r, bg)) continue;
    l.n += r.n;
    merged(l, bg);
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[size_t(r.next)].prev = bg.left;
    offer(l.prev, bg.left);
    offer(bg.left, l.next);
  }
}

struct SpmSymbol {
  int prev, next;
  size_t off, n;
};

struct SpmBigram {
  int left, right;
  float score;
  size_t size;
};

struct SpmBigramLess {
  bool operator()(const SpmBigram& l, const SpmBigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

}  // namespace

void Tokenizer::Impl::encode_spm(std::string_view frag, bool prefix_space, std::vector<int32_t>& out) const {
  std::string s;
  s.reserve(frag.size() + 16);
  if (prefix_space) s.append(kSpmSpace);
  for (char c : frag) {
    if (c == ' ') {
      s.append(kSpmSpace);
    } else {
      s += c;
    }
  }
  if (s.empty()) return;
  if (!spm_split_at_spaces) {
    encode_spm_chunk(s, out);
    return;
  }
  // Split before each "▁" that does not follow another "▁": no vocab piece can span such a point
  // (see spm_split_at_spaces), so the chunks merge independently and the result is the same as for
  // the whole string, with small heaps instead of one huge one.
  size_t start = 0;
  for (size_t p = s.find(kSpmSpace, 1); p != std::string::npos; p = s.find(kSpmSpace, p + 1)) {
    if (p >= 3 && std::string_view(s).substr(p - 3, 3) == kSpmSpace) continue;
    encode_spm_chunk(std::string_view(s).substr(start, p - start), out);
    start = p;
  }
  encode_spm_chunk(std::string_view(s).substr(start), out);
}

void Tokenizer::Impl::encode_spm_chunk(std::string_view s, std::vector<int32_t>& out) const {
  // Characters; a byte that does not start a well-formed sequence is a symbol of its own (llama.cpp
  // trusts the lead byte, which can swallow the next "▁" and so lose a space on invalid UTF-8).
  std::vector<SpmSymbol> sym;
  sym.reserve(s.size());
  const auto* bytes = reinterpret_cast<const uint8_t*>(s.data());
  for (size_t off = 0; off < s.size();) {
    const int r = utf8_check(bytes + off, s.size() - off);
    const size_t len = r > 0 ? size_t(r) : 1;
    const int idx = static_cast<int>(sym.size());
    sym.push_back({idx - 1, off + len == s.size() ? -1 : idx + 1, off, len});
    off += len;
  }

  std::priority_queue<SpmBigram, std::vector<SpmBigram>, SpmBigramLess> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const std::string_view t(s.data() + sym[size_t(left)].off, sym[size_t(left)].n + sym[size_t(right)].n);
    const int32_t id = lookup(t);
    if (id < 0) return;
    queue.push({left, right, score.empty() ? 0.0f : score[size_t(id)], t.size()});
  };
  merge_bigrams(
      sym, queue, try_add,
      [](const SpmSymbol& l, const SpmSymbol& r, const SpmBigram& bg) { return l.n + r.n != bg.size; },
      [](SpmSymbol&, const SpmBigram&) {});

  // Every merged symbol is a vocab piece (bigrams are only queued for pieces), so a symbol that is
  // not a piece is a single character: emit its bytes (llama.cpp's resegment reduces to this).
  for (int i = 0; i != -1; i = sym[size_t(i)].next) {
    const SpmSymbol& y = sym[size_t(i)];
    const std::string_view t(s.data() + y.off, y.n);
    const int32_t id = lookup(t);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    bool all_bytes = true;
    for (char c : t) all_bytes = all_bytes && byte_token[uint8_t(c)] >= 0;
    if (all_bytes) {
      for (char c : t) out.push_back(byte_token[uint8_t(c)]);
    } else if (unk >= 0) {
      out.push_back(unk);  // no byte fallback in this vocab: one <unk> per character
    }
  }
}

// ------------------------------------------------------------------------------------------ BPE

namespace {

struct BpeSymbol {
  int prev, next;
  uint32_t off, n;  // bytes of the encoded word
  int32_t id;       // -1 when the text is not a vocab piece
};

struct BpeBigram {
  int left, right;
  int32_t rank;
  int32_t left_id, right_id, result;
};

struct BpeBigramLess {  // top of the heap: lowest rank, then leftmost
  bool operator()(const BpeBigram& l, const BpeBigram& r) const {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  }
};

}  // namespace

void Tokenizer::Impl::bpe_word(std::string_view w, std::vector<int32_t>& out) const {
  if (w.empty()) return;
  if (ignore_merges) {
    if (int32_t id = lookup(w); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<BpeSymbol> sym;
  sym.reserve(w.size());
  for (size_t off = 0; off < w.size();) {
    const size_t len = std::min(lead_len(uint8_t(w[off])), w.size() - off);
    const int idx = static_cast<int>(sym.size());
    sym.push_back({idx - 1, off + len == w.size() ? -1 : idx + 1, uint32_t(off), uint32_t(len),
                   lookup(w.substr(off, len))});
    off += len;
  }
  if (sym.size() == 1 && sym[0].id >= 0) {
    out.push_back(sym[0].id);
    return;
  }
  std::vector<BpeBigram> heap_storage;
  heap_storage.reserve(sym.size());
  std::priority_queue<BpeBigram, std::vector<BpeBigram>, BpeBigramLess> queue(BpeBigramLess{},
                                                                              std::move(heap_storage));
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const int32_t a = sym[size_t(left)].id, b = sym[size_t(right)].id;
    if (a < 0 || b < 0) return;
    auto it = merges.find((uint64_t(uint32_t(a)) << 32) | uint32_t(b));
    if (it == merges.end()) return;
    queue.push({left, right, it->second.rank, a, b, it->second.result});
  };
  // Stale when either side has been merged since (ids identify texts).
  merge_bigrams(
      sym, queue, try_add,
      [](const BpeSymbol& l, const BpeSymbol& r, const BpeBigram& bg) {
        return l.id != bg.left_id || r.id != bg.right_id || l.next != bg.right;
      },
      [](BpeSymbol& l, const BpeBigram& bg) { l.id = bg.result; });

  for (int i = 0; i != -1; i = sym[size_t(i)].next) {
    const BpeSymbol& y = sym[size_t(i)];
    if (y.n == 0) continue;
    if (y.id >= 0) {
      out.push_back(y.id);
      continue;
    }
    // Not a piece (only with inconsistent vocabs): its characters one by one.
    const std::string_view t = w.substr(y.off, y.n);
    for (size_t k = 0; k < t.size();) {
      const size_t len = std::min(lead_len(uint8_t(t[k])), t.size() - k);
      if (int32_t id = lookup(t.substr(k, len)); id >= 0) out.push_back(id);
      k += len;
    }
  }
}

void Tokenizer::Impl::encode_bpe(std::string_view frag, std::vector<int32_t>& out) const {
  std::string encoded;
  for (const PreTokenizer::Word& w : pretokenizer->split(frag)) {
    encoded.clear();
    for (size_t k = w.offset; k < w.offset + w.length; ++k) encoded += byte_char[uint8_t(frag[k])];
    bpe_word(encoded, out);
  }
}

// ------------------------------------------------------------------------------------------ API

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const GgufFile& file) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  if (Status s = t->impl_->load(file); !s.ok()) return s;
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && m.bos >= 0) out.push_back(m.bos);
  const auto frags = m.partition(text, parse_special);
  if (m.model == Impl::Model::Spm) {
    bool prev_special = true;  // the dummy prefix goes at the start and after each special token
    for (const auto& fr : frags) {
      if (fr.token >= 0) {
        out.push_back(fr.token);
        prev_special = true;
      } else {
        m.encode_spm(text.substr(fr.off, fr.len), m.add_space_prefix && prev_special, out);
        prev_special = false;
      }
    }
  } else {
    for (const auto& fr : frags) {
      if (fr.token >= 0) {
        out.push_back(fr.token);
      } else {
        m.encode_bpe(text.substr(fr.off, fr.len), out);
      }
    }
  }
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
  const Impl& m = *impl_;
  if (id < 0 || id >= n_vocab()) return {};
  const TokenType t = m.type[size_t(id)];
  if (!special && (t == TokenType::Control || t == TokenType::Unknown)) return {};
  return m.piece[size_t(id)];
}

std::string_view Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return {};
  return impl_->text[size_t(id)];
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return TokenType::Undefined;
  return impl_->type[size_t(id)];
}

float Tokenizer::token_score(int32_t id) const {
  if (id < 0 || id >= n_vocab() || impl_->score.empty()) return 0.0f;
  return impl_->score[size_t(id)];
}

int32_t Tokenizer::token_id(std::string_view text) const { return impl_->lookup(text); }
int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->text.size()); }
int32_t Tokenizer::bos() const { return impl_->bos; }
int32_t Tokenizer::eos() const { return impl_->eos; }
int32_t Tokenizer::eot() const { return impl_->eot; }
int32_t Tokenizer::eom() const { return impl_->eom; }
int32_t Tokenizer::unk() const { return impl_->unk; }
int32_t Tokenizer::pad() const { return impl_->pad; }
bool Tokenizer::is_end_of_generation(int32_t id) const {
  return id >= 0 && id < n_vocab() && impl_->eog[size_t(id)] != 0;
}
bool Tokenizer::add_bos_default() const { return impl_->add_bos; }
bool Tokenizer::add_eos_default() const { return impl_->add_eos; }
bool Tokenizer::is_spm() const { return impl_->model == Impl::Model::Spm; }
bool Tokenizer::strips_leading_space() const { return is_spm() && impl_->add_space_prefix; }
std::string_view Tokenizer::kind() const { return impl_->kind; }
std::string_view Tokenizer::chat_template() const { return impl_->chat_template; }

std::string Tokenizer::decode(std::span<const int32_t> ids, bool special) const {
  Detokenizer d(*this, special);
  std::string out;
  for (int32_t id : ids) out += d.feed(id);
  out += d.flush();
  return out;
}

// ------------------------------------------------------------------------------------------ Detokenizer

Detokenizer::Detokenizer(const Tokenizer& tokenizer, bool special)
    : tok_(tokenizer),
      special_(special),
      strip_space_(tokenizer.strips_leading_space()) {}

std::string Detokenizer::feed(int32_t id) {
  std::string p = tok_.token_to_piece(id, special_);
  std::string out;
  if (p.empty()) return out;
  if (at_start_) {
    at_start_ = false;
    if (strip_space_ && p[0] == ' ') p.erase(0, 1);
  }
  if (pending_.empty()) {
    const size_t used = utf8_drain(p, out, false);
    pending_.assign(p, used, std::string::npos);
  } else {
    pending_ += p;
    const size_t used = utf8_drain(pending_, out, false);
    pending_.erase(0, used);
  }
  return out;
}

std::string Detokenizer::flush() {
  std::string out;
  utf8_drain(pending_, out, true);
  pending_.clear();
  return out;
}

void Detokenizer::reset() {
  pending_.clear();
  at_start_ = true;
}

}  // namespace towers
