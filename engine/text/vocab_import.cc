#include "engine/text/vocab_import.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

namespace towers {

std::vector<std::string> byte_level_alphabet() {
  std::vector<std::string> out(256);
  auto utf8 = [](uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    out[b] = utf8(printable ? b : 256 + extra++);
  }
  return out;
}

Result<int> add_hf_bpe_tokenizer(GgufWriter& w, const std::string& path, const HfVocabOptions& opt) {
  std::ifstream in(path);
  if (!in) return Status::Error(path + ": cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    return Status::Error(path + ": not valid JSON: " + e.what());
  }
  try {
    const auto& model = j.at("model");
    if (model.value("type", "") != "BPE") return Status::Error(path + ": model.type is not BPE");
    std::map<int, std::string> by_id;
    for (const auto& [tok, id] : model.at("vocab").items()) by_id[id.get<int>()] = tok;
    std::map<int, int> types;  // id -> GGUF token type for added tokens
    if (j.contains("added_tokens")) {
      for (const auto& a : j["added_tokens"]) {
        int id = a.at("id").get<int>();
        by_id[id] = a.at("content").get<std::string>();
        const std::string& text = by_id[id];
        // Like llama.cpp's converter: added tokens spelled <|...|> are control tokens even when
        // tokenizer.json does not flag them special (Qwen's <|fim_prefix|>, <|repo_name|>, ...).
        const bool looks_special = text.size() > 4 && text.starts_with("<|") && text.ends_with("|>");
        types[id] = a.value("special", false) || looks_special ? 3 : 4;  // CONTROL : USER_DEFINED
      }
    }
    if (by_id.empty() || by_id.begin()->first != 0 || by_id.rbegin()->first != int(by_id.size()) - 1) {
      return Status::Error(path + ": token ids are not contiguous from 0");
    }
    int n = static_cast<int>(by_id.size());
    std::vector<std::string> tokens;
    std::vector<int32_t> token_type;
    for (auto& [id, tok] : by_id) {
      tokens.push_back(tok);
      token_type.push_back(types.count(id) ? types[id] : 1);
    }
    for (int i = n; i < opt.pad_to; ++i) {
      tokens.push_back("[PAD" + std::to_string(i) + "]");
      token_type.push_back(5);  // UNUSED
    }
    std::vector<std::string> merges;
    for (const auto& m : model.at("merges")) {
      if (m.is_string()) {
        merges.push_back(m.get<std::string>());
      } else {
        merges.push_back(m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());
      }
    }
    auto find = [&](std::initializer_list<const char*> names) -> int {
      for (const char* name : names) {
        for (auto& [id, tok] : by_id) {
          if (tok == name) return id;
        }
      }
      return -1;
    };
    const int bos = find({"<|begin_of_text|>", "<|endoftext|>"});
    const int eos = find({"<|end_of_text|>", "<|endoftext|>"});
    const int eot = find({"<|eot_id|>", "<|im_end|>"});
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", opt.pre);
    w.set_string_array("tokenizer.ggml.tokens", std::move(tokens));
    w.set_i32_array("tokenizer.ggml.token_type", std::move(token_type));
    w.set_string_array("tokenizer.ggml.merges", std::move(merges));
    if (bos >= 0) w.set_u32("tokenizer.ggml.bos_token_id", bos);
    if (eos >= 0) w.set_u32("tokenizer.ggml.eos_token_id", eos);
    if (eot >= 0) w.set_u32("tokenizer.ggml.eot_token_id", eot);
    w.set_bool("tokenizer.ggml.add_bos_token", opt.pre == "llama-bpe");
    if (!opt.chat_template.empty()) w.set_string("tokenizer.chat_template", opt.chat_template);
    return std::max(n, opt.pad_to);
  } catch (const std::exception& e) {
    return Status::Error(path + ": unexpected tokenizer.json layout: " + e.what());
  }
}

Result<int> copy_gguf_tokenizer(GgufWriter& w, const GgufFile& src) {
  int n_vocab = 0;
  for (const auto& kv : src.metadata()) {
    if (!kv.key.starts_with("tokenizer.")) continue;
    const GgufValue& v = kv.value;
    std::string key(kv.key);
    switch (v.type) {
      case GgufValueType::STRING: w.set_string(key, std::string(v.str)); break;
      case GgufValueType::BOOL: w.set_bool(key, v.u != 0); break;
      case GgufValueType::FLOAT32: case GgufValueType::FLOAT64: w.set_f32(key, float(v.f)); break;
      case GgufValueType::ARRAY:
        if (v.elem_type == GgufValueType::STRING) {
          std::vector<std::string> s(v.strings.begin(), v.strings.end());
          if (key == "tokenizer.ggml.tokens") n_vocab = static_cast<int>(s.size());
          w.set_string_array(key, std::move(s));
        } else if (v.elem_type == GgufValueType::FLOAT32 || v.elem_type == GgufValueType::FLOAT64) {
          w.set_f32_array(key, *src.get_f32_array(key));
        } else {
          w.set_i32_array(key, *src.get_i32_array(key));
        }
        break;
      default:
        if (v.is_integer()) {
          if (v.as_int() >= 0 && v.as_int() <= INT64_C(0xFFFFFFFF)) w.set_u32(key, uint32_t(v.as_int()));
          else w.set_i32(key, int32_t(v.as_int()));
        }
    }
  }
  if (n_vocab == 0) return Status::Error(src.path() + ": no tokenizer.ggml.tokens");
  return n_vocab;
}

void add_generated_bpe_tokenizer(GgufWriter& w, int n_vocab, const std::string& chat_template) {
  std::vector<std::string> alpha = byte_level_alphabet();
  std::vector<std::string> tokens(alpha.begin(), alpha.end());
  std::vector<int32_t> types(256, 1);
  std::vector<std::string> merges;
  std::set<std::string> seen(tokens.begin(), tokens.end());
  // Letter pairs, then "Ġ"+letter (space-prefixed), then pair+letter, in a fixed order.
  const std::string letters = "etaoinshrdlcumwfgypbvkjxqz";
  const std::string space = alpha[' '];
  std::vector<std::pair<std::string, std::string>> candidates;
  for (char a : letters) candidates.push_back({space, std::string(1, a)});
  for (char a : letters)
    for (char b : letters) candidates.push_back({std::string(1, a), std::string(1, b)});
  const int specials = 3;
  for (size_t i = 0; i < candidates.size() && int(tokens.size()) < n_vocab - specials; ++i) {
    std::string merged = candidates[i].first + candidates[i].second;
    if (!seen.insert(merged).second) continue;
    merges.push_back(candidates[i].first + " " + candidates[i].second);
    tokens.push_back(merged);
    types.push_back(1);
  }
  for (int i = 0; int(tokens.size()) < n_vocab - specials; ++i) {
    tokens.push_back("<|reserved_" + std::to_string(i) + "|>");
    types.push_back(5);
  }
  const int bos = static_cast<int>(tokens.size());
  for (const char* s : {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"}) {
    tokens.push_back(s);
    types.push_back(3);
  }
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "llama-bpe");
  w.set_string_array("tokenizer.ggml.tokens", std::move(tokens));
  w.set_i32_array("tokenizer.ggml.token_type", std::move(types));
  w.set_string_array("tokenizer.ggml.merges", std::move(merges));
  w.set_u32("tokenizer.ggml.bos_token_id", bos);
  w.set_u32("tokenizer.ggml.eos_token_id", bos + 1);
  w.set_u32("tokenizer.ggml.eot_token_id", bos + 2);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  if (!chat_template.empty()) w.set_string("tokenizer.chat_template", chat_template);
}

}  // namespace towers
