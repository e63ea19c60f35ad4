#include "daemon/api_logprobs.h"

#include <cstdio>

#include "engine/text/tokenizer.h"

namespace towers::daemon::api {

using json = nlohmann::json;

std::string token_string(std::string_view bytes) {
  if (is_valid_utf8(bytes)) return std::string(bytes);
  std::string s = "bytes:";
  for (unsigned char c : bytes) {
    char hex[5];
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    s += hex;
  }
  return s;
}

namespace {
json byte_array(std::string_view bytes) {
  json a = json::array();
  for (unsigned char c : bytes) a.push_back(static_cast<int>(c));
  return a;
}
json chat_entry(const TokenLogprob& t) {
  return {{"token", token_string(t.bytes)}, {"logprob", t.logprob}, {"bytes", byte_array(t.bytes)}};
}
}  // namespace

json chat_logprobs(std::span<const Logprobs> tokens) {
  json content = json::array();
  for (const Logprobs& lp : tokens) {
    json e = chat_entry(lp.chosen);
    e["top_logprobs"] = json::array();
    for (const TokenLogprob& t : lp.top) e["top_logprobs"].push_back(chat_entry(t));
    content.push_back(std::move(e));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

json completion_logprobs(std::span<const Logprobs> tokens, size_t* text_offset) {
  json out = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const Logprobs& lp : tokens) {
    out["tokens"].push_back(token_string(lp.chosen.bytes));
    out["token_logprobs"].push_back(lp.chosen.logprob);
    json top = json::object();
    for (const TokenLogprob& t : lp.top) top[token_string(t.bytes)] = t.logprob;
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(*text_offset);
    *text_offset += lp.chosen.bytes.size();
  }
  return out;
}

}  // namespace towers::daemon::api
