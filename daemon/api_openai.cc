// OpenAI-compatible endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models[/{id}]
// (each request's body parsed once into a GenerationRequest); and the table of the
// generation fields towerd honours, knowingly ignores, or refuses. The generation itself runs and
// answers as a Turn (daemon/turns.h).
#include <algorithm>
#include <charconv>

#include "daemon/api_views.h"
#include "daemon/log.h"
#include "daemon/random_id.h"
#include "daemon/service.h"
#include "daemon/turns.h"
#include "engine/constrained/grammar.h"
#include "engine/constrained/grammar_matcher.h"
#include "engine/constrained/json_schema.h"
#include "engine/constrained/tool_format.h"

namespace towers::daemon {

std::shared_ptr<const TokenTrie> Service::token_trie() const {
  std::call_once(token_trie_once, [this] { token_trie_ = TokenTrie::from_tokenizer(model.tokenizer()); });
  return token_trie_;
}

bool Service::serves(const std::string& name) const {
  if (name.empty() || name == model_id) return true;
  if (name == std::filesystem::path(config.model_path).filename().string()) return true;
  return std::find(config.aliases.begin(), config.aliases.end(), name) != config.aliases.end();
}

namespace api {

using json = nlohmann::json;

namespace {

// What towerd does with a generation field. Refused fields are accepted only with their neutral
// value (the one that asks for nothing), or null.
enum class Support {
  Honoured,     // implemented (parse_gen_params reads it)
  Metadata,     // accepted and ignored: it cannot change the reply (e.g. "user")
  NotYet,       // being implemented (issue 14); drop the row's neutral check when it lands
  Unsupported,  // towerd will not do it (audio, web search, ...)
};
struct FieldRule {
  std::string_view name;
  Support support;
  bool (*neutral)(const json&) = nullptr;  // NotYet/Unsupported: the accepted values
  std::string_view accepted = "";          // ... as the error message names them
};

bool is_false(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool is_empty(const json& v) { return (v.is_array() || v.is_object()) && v.empty(); }
bool no_tool_choice(const json& v) { return v == "none" || v == "auto"; }
bool text_only(const json& v) { return v == json::array({"text"}); }
bool default_tier(const json& v) { return v == "auto" || v == "default"; }
bool never(const json&) { return false; }

constexpr FieldRule kGenerationFields[] = {
    {"temperature", Support::Honoured},
    {"top_p", Support::Honoured},
    {"top_k", Support::Honoured},
    {"min_p", Support::Honoured},
    {"repeat_penalty", Support::Honoured},
    {"seed", Support::Honoured},
    {"max_tokens", Support::Honoured},
    {"max_completion_tokens", Support::Honoured},
    {"stop", Support::Honoured},
    {"stream", Support::Honoured},
    {"stream_options", Support::Honoured},
    {"n", Support::Honoured},
    {"logprobs", Support::Honoured},
    {"top_logprobs", Support::Honoured},
    {"presence_penalty", Support::Honoured},
    {"frequency_penalty", Support::Honoured},
    {"logit_bias", Support::Honoured},
    {"user", Support::Metadata},
    {"safety_identifier", Support::Metadata},
    {"prompt_cache_key", Support::Metadata},
    {"metadata", Support::Metadata},
    {"tools", Support::Honoured},
    {"tool_choice", Support::Honoured},
    {"parallel_tool_calls", Support::Honoured},
    {"response_format", Support::Honoured},
    {"audio", Support::Unsupported, never, "null"},
    {"modalities", Support::Unsupported, text_only, "[\"text\"]"},
    {"prediction", Support::Unsupported, never, "null"},
    {"web_search_options", Support::Unsupported, never, "null"},
    {"functions", Support::Unsupported, is_empty, "[]"},
    {"function_call", Support::Unsupported, no_tool_choice, "\"none\", \"auto\""},
    {"reasoning_effort", Support::Unsupported, never, "null"},
    {"verbosity", Support::Unsupported, never, "null"},
    {"store", Support::Unsupported, is_false, "false"},
    {"service_tier", Support::Unsupported, default_tier, "\"auto\", \"default\""},
};

ApiStatus content_text(const json& m, size_t i, std::string* out) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  if (!m.contains("content") || m["content"].is_null()) return invalid_field(where, where + " is missing");
  const json& c = m["content"];
  if (c.is_string()) {
    *out = c.get<std::string>();
    return {};
  }
  if (!c.is_array()) return invalid_field(where, where + " must be a string or an array of text parts");
  out->clear();
  for (const auto& part : c) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
      return ApiStatus(Status::Unimplemented(where + ": only text parts ({\"type\":\"text\",\"text\":...}) are supported"),
                       where);
    }
    *out += part["text"].get<std::string>();
  }
  return {};
}

// One assistant message's "tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}].
ApiStatus parse_tool_calls(const json& calls, const std::string& at, std::vector<ToolCall>* out) {
  const std::string where = at + ".tool_calls";
  if (!calls.is_array()) return invalid_field(where, where + " must be an array");
  for (size_t j = 0; j < calls.size(); ++j) {
    const json& c = calls[j];
    const std::string cat = where + "[" + std::to_string(j) + "]";
    if (!c.is_object() || c.value("type", "function") != "function" || !c.contains("function") || !c["function"].is_object()) {
      return invalid_field(cat, cat + " must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}");
    }
    const json& f = c["function"];
    if (!f.contains("name") || !f["name"].is_string()) return invalid_field(cat + ".function.name", cat + ".function.name must be a string");
    if (f.contains("arguments") && !f["arguments"].is_string() && !f["arguments"].is_null()) {
      return invalid_field(cat + ".function.arguments", cat + ".function.arguments must be a string of JSON");
    }
    ToolCall call;
    call.id = c.contains("id") && c["id"].is_string() ? c["id"].get<std::string>() : "";
    call.name = f["name"].get<std::string>();
    call.arguments = f.contains("arguments") && f["arguments"].is_string() ? f["arguments"].get<std::string>() : "{}";
    if (!json::accept(call.arguments)) {
      return invalid_field(cat + ".function.arguments", cat + ".function.arguments is not valid JSON");
    }
    out->push_back(std::move(call));
  }
  return {};
}

// "messages": system (or developer) first, then user, assistant (text, or tool_calls with null
// content) and tool (a tool's result, with its tool_call_id) messages.
ApiStatus parse_messages(const json& body, std::vector<ToolChatMessage>* out) {
  if (!body.contains("messages")) return invalid_field("messages", "\"messages\" is required");
  const json& ms = body["messages"];
  if (!ms.is_array() || ms.empty()) return invalid_field("messages", "\"messages\" must be a non-empty array");
  for (size_t i = 0; i < ms.size(); ++i) {
    const json& m = ms[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return invalid_field(at, at + " must be an object");
    if (!m.contains("role") || !m["role"].is_string()) return invalid_field(at + ".role", at + ".role must be a string");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return ApiStatus(Status::Unimplemented(at + ".role \"" + role + "\" is not supported (system, user, assistant, tool)"),
                       at + ".role");
    }
    // "name" (OpenAI's participant name; LangChain also sends it on tool messages) is accepted on every
    // role and not rendered: none of the chat templates towerd writes has a place for it.
    if (m.contains("name") && !m["name"].is_null() && !m["name"].is_string())
      return invalid_field(at + ".name", at + ".name must be a string");
    for (const auto& [k, v] : m.items()) {
      const bool known = k == "role" || k == "content" || k == "name" ||
                         (role == "assistant" && (k == "tool_calls" || k == "refusal")) ||
                         (role == "tool" && k == "tool_call_id");
      if (!known && !v.is_null() && !is_empty(v)) {
        return ApiStatus(Status::Unimplemented(at + "." + k + " is not supported (a message has a role and a content" +
                                               std::string(role == "assistant" ? ", or tool_calls" : "") +
                                               (role == "tool" ? " and a tool_call_id" : "") + ")"),
                         at + "." + k);
      }
    }
    if (role == "system" && i != 0) return invalid_field(at + ".role", "only the first message may be a system message");
    ToolChatMessage msg;
    msg.role = role;
    const bool has_calls = role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null() && !is_empty(m["tool_calls"]);
    if (has_calls) {
      if (ApiStatus e = parse_tool_calls(m["tool_calls"], at, &msg.tool_calls); !e.ok()) return e;
    }
    if (!(has_calls && (!m.contains("content") || m["content"].is_null()))) {
      if (ApiStatus e = content_text(m, i, &msg.content); !e.ok()) return e;
    }
    if (role == "tool") {
      if (!m.contains("tool_call_id") || !m["tool_call_id"].is_string()) {
        return invalid_field(at + ".tool_call_id", at + ".tool_call_id is required for a tool message");
      }
      msg.tool_call_id = m["tool_call_id"].get<std::string>();
    }
    out->push_back(std::move(msg));
  }
  return {};
}

// A conversation without tools and without a session: an optional system message, then user,
// assistant, ..., user (what the chat template renders and the reply continues).
ApiStatus check_turn_order(const std::vector<ToolChatMessage>& messages) {
  const std::string rule =
      "after an optional system message, messages alternate user/assistant, starting and ending with a user message";
  const size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
  if (messages.size() == first) return invalid_field("messages", "\"messages\" has no user message: " + rule);
  for (size_t i = first; i < messages.size(); ++i) {
    const char* want = (i - first) % 2 == 0 ? "user" : "assistant";
    if (messages[i].role != want) {
      const std::string at = "messages[" + std::to_string(i) + "].role";
      return invalid_field(at, at + " is \"" + messages[i].role + "\" where \"" + want + "\" is expected: " + rule);
    }
  }
  if (messages.back().role != "user") return invalid_field("messages", "the last message is not the user's: " + rule);
  return {};
}

}  // namespace

ApiStatus parse_tools(const json& b, const nlohmann::ordered_json& ordered, bool session, ToolRequest* out) {
  if (b.contains("tools") && !b["tools"].is_null()) {
    const json& ts = b["tools"];
    if (!ts.is_array()) return invalid_field("tools", "\"tools\" must be an array");
    if (ts.size() > 128) return invalid_field("tools", "at most 128 tools");
    for (size_t i = 0; i < ts.size(); ++i) {
      const std::string at = "tools[" + std::to_string(i) + "]";
      const json& t = ts[i];
      if (!t.is_object() || !t.contains("type") || t["type"] != "function") {
        return ApiStatus(Status::Unimplemented(at + ".type: only \"function\" tools are supported"), at + ".type");
      }
      if (!t.contains("function") || !t["function"].is_object()) return invalid_field(at + ".function", at + ".function is required");
      const json& f = t["function"];
      if (!f.contains("name") || !f["name"].is_string()) return invalid_field(at + ".function.name", at + ".function.name must be a string");
      ToolDefinition def;
      def.name = f["name"].get<std::string>();
      if (f.contains("description") && f["description"].is_string()) def.description = f["description"].get<std::string>();
      if (f.contains("parameters") && !f["parameters"].is_null()) {
        if (!f["parameters"].is_object()) return invalid_field(at + ".function.parameters", at + ".function.parameters must be a JSON schema object");
        const auto* of = ordered.is_object() && ordered.contains("tools") && ordered["tools"].is_array() && ordered["tools"].size() > i
                             ? &ordered["tools"][i]["function"]
                             : nullptr;
        def.parameters = of && of->is_object() && of->contains("parameters") ? (*of)["parameters"].dump() : f["parameters"].dump();
      }
      out->tools.push_back(std::move(def));
    }
  }
  if (b.contains("tool_choice") && !b["tool_choice"].is_null()) {
    const json& c = b["tool_choice"];
    if (c == "none") out->choice.mode = ToolChoice::Mode::None;
    else if (c == "auto") out->choice.mode = ToolChoice::Mode::Auto;
    else if (c == "required") out->choice.mode = ToolChoice::Mode::Required;
    else if (c.is_object() && c.value("type", "") == "function" && c.contains("function") && c["function"].is_object() &&
             c["function"].contains("name") && c["function"]["name"].is_string()) {
      out->choice.mode = ToolChoice::Mode::Named;
      out->choice.name = c["function"]["name"].get<std::string>();
    } else {
      return invalid_field("tool_choice",
                           "\"tool_choice\" must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    const bool asks = out->choice.mode == ToolChoice::Mode::Required || out->choice.mode == ToolChoice::Mode::Named;
    if (asks && out->tools.empty() && !session) return invalid_field("tool_choice", "\"tool_choice\" asks for a tool call but \"tools\" is empty");
  }
  if (b.contains("parallel_tool_calls") && !b["parallel_tool_calls"].is_null()) {
    if (!b["parallel_tool_calls"].is_boolean()) return invalid_field("parallel_tool_calls", "\"parallel_tool_calls\" must be true or false");
    out->parallel = b["parallel_tool_calls"].get<bool>();
  }
  return {};
}

namespace {

// "logit_bias": {"token id": bias, ...}; ids checked against the vocabulary.
ApiStatus parse_logit_bias(const Service& svc, const json& b, SamplerConfig* sampling) {
  if (!b.contains("logit_bias") || b["logit_bias"].is_null()) return {};
  const json& lb = b["logit_bias"];
  if (!lb.is_object()) return invalid_field("logit_bias", "\"logit_bias\" must be an object of token id -> bias");
  for (const auto& [k, v] : lb.items()) {
    int32_t id = -1;
    const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), id);
    if (ec != std::errc() || end != k.data() + k.size() || k.empty()) {
      return invalid_field("logit_bias", "logit_bias: \"" + k + "\" is not a token id (a decimal integer)");
    }
    if (!v.is_number()) return invalid_field("logit_bias", "logit_bias: the bias of token " + k + " must be a number");
    sampling->logit_bias.emplace_back(id, v.get<float>());
  }
  SamplerConfig just_bias;
  just_bias.logit_bias = sampling->logit_bias;
  if (Status st = check_sampler_config(just_bias, svc.model.config().n_vocab); !st.ok()) {
    return ApiStatus(st, "logit_bias");
  }
  return {};
}

// Chat: "logprobs": true|false, "top_logprobs": 0..20 (only with logprobs, as OpenAI requires).
// Completions: "logprobs": 0..20, the count of alternatives (null: none).
ApiStatus parse_logprobs(const json& b, ReplyApi api, SamplerConfig* sampling) {
  sampling->logprobs = -1;
  if (api == ReplyApi::Completions) {
    if (!b.contains("logprobs") || b["logprobs"].is_null()) return {};
    const json& l = b["logprobs"];
    if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() > kMaxTopLogprobs) {
      return invalid_field("logprobs", "\"logprobs\" must be an integer from 0 to " + std::to_string(kMaxTopLogprobs));
    }
    sampling->logprobs = l.get<int>();
    return {};
  }
  bool on = false;
  if (b.contains("logprobs") && !b["logprobs"].is_null()) {
    if (!b["logprobs"].is_boolean()) return invalid_field("logprobs", "\"logprobs\" must be true or false");
    on = b["logprobs"].get<bool>();
  }
  int top = 0;
  if (b.contains("top_logprobs") && !b["top_logprobs"].is_null()) {
    const json& t = b["top_logprobs"];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > kMaxTopLogprobs) {
      return invalid_field("top_logprobs", "\"top_logprobs\" must be an integer from 0 to " + std::to_string(kMaxTopLogprobs));
    }
    top = t.get<int>();
    if (!on) return invalid_field("top_logprobs", "\"top_logprobs\" needs \"logprobs\": true");
  }
  sampling->logprobs = on ? top : -1;
  return {};
}

// "response_format": {"type": "text"} (free text), {"type": "json_object"} (any JSON object), or
// {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}: the schema is
// compiled to a grammar (engine/constrained/json_schema.h) that every sampled token must follow.
ApiStatus parse_response_format(const Service& svc, const json& b, std::string_view raw_body,
                                std::shared_ptr<GrammarAutomaton>* grammar) {
  if (!b.contains("response_format") || b["response_format"].is_null()) return {};
  const json& rf = b["response_format"];
  const std::string type = rf.is_object() && rf.contains("type") && rf["type"].is_string() ? rf["type"].get<std::string>() : "";
  std::string gbnf;
  if (type == "text") {
    return {};
  } else if (type == "json_object") {
    gbnf = json_object_gbnf();
  } else if (type == "json_schema") {
    const json* js = rf.contains("json_schema") && rf["json_schema"].is_object() ? &rf["json_schema"] : nullptr;
    if (!js || !js->contains("schema") || !(*js)["schema"].is_object()) {
      return invalid_field("response_format.json_schema.schema",
                           "response_format of type \"json_schema\" needs \"json_schema\": {\"name\": ..., \"schema\": {...}}");
    }
    // The schema's own text, in the client's key order (properties come out in that order, as
    // OpenAI's strict mode gives them); `b` is a sorted map.
    std::string schema_text = (*js)["schema"].dump();
    if (!raw_body.empty()) {
      const auto ordered = nlohmann::ordered_json::parse(raw_body, nullptr, /*allow_exceptions=*/false);
      if (ordered.is_object()) schema_text = ordered["response_format"]["json_schema"]["schema"].dump();
    }
    auto compiled = json_schema_to_gbnf(schema_text);
    if (!compiled.ok()) return invalid_field("response_format.json_schema.schema", "response_format: " + compiled.error());
    gbnf = compiled.value();
  } else {
    return invalid_field("response_format.type", "response_format.type must be \"text\", \"json_object\" or \"json_schema\"");
  }
  auto g = Grammar::parse(gbnf);
  if (!g.ok()) return invalid_field("response_format", "response_format: " + g.error());
  *grammar = std::make_shared<GrammarAutomaton>(g.value(), svc.token_trie());
  return {};
}

// "stream_options": {"include_usage": bool} (and "include_obfuscation", which changes nothing here:
// towerd pads no chunk). Only with "stream": true, as OpenAI requires.
ApiStatus parse_stream_options(const json& b, bool stream, bool* include_usage) {
  *include_usage = false;
  if (!b.contains("stream_options") || b["stream_options"].is_null()) return {};
  const json& o = b["stream_options"];
  if (!o.is_object()) return invalid_field("stream_options", "\"stream_options\" must be an object");
  if (!stream) return invalid_field("stream_options", "\"stream_options\" is only allowed with \"stream\": true");
  for (const auto& [k, v] : o.items()) {
    if (k != "include_usage" && k != "include_obfuscation") {
      return ApiStatus(Status::InvalidArgument("unknown field \"stream_options." + k + "\""), "stream_options." + k,
                       "unknown_parameter");
    }
    if (!v.is_boolean() && !v.is_null()) {
      return invalid_field("stream_options." + k, "\"stream_options." + k + "\" must be true or false");
    }
  }
  *include_usage = o.contains("include_usage") && o["include_usage"].is_boolean() && o["include_usage"].get<bool>();
  return {};
}

}  // namespace

ApiStatus check_generation_fields(const json& body, std::initializer_list<std::string_view> own) {
  for (const auto& [k, v] : body.items()) {
    if (std::find(own.begin(), own.end(), k) != own.end()) continue;
    const FieldRule* rule = nullptr;
    for (const auto& r : kGenerationFields) {
      if (r.name == k) rule = &r;
    }
    if (!rule) {
      return ApiStatus(Status::InvalidArgument("unknown field \"" + k + "\""), k, "unknown_parameter");
    }
    if (rule->support == Support::Honoured || rule->support == Support::Metadata || v.is_null() || rule->neutral(v)) {
      continue;
    }
    const char* what = rule->support == Support::NotYet ? " is not supported yet" : " is not supported by towerd";
    return ApiStatus(Status::Unimplemented("\"" + k + "\"" + what + " (accepted: " + std::string(rule->accepted) + ")"), k);
  }
  return {};
}

ApiStatus parse_gen_params(const Service& svc, const json& b, ReplyApi api, GenParams* params, std::string_view raw_body) {
  GenParams& p = *params;
  auto number = [&](const char* k, double lo, double hi, float* out) -> ApiStatus {
    if (!b.contains(k) || b[k].is_null()) return {};
    if (!b[k].is_number()) return invalid_field(k, std::string("\"") + k + "\" must be a number");
    double v = b[k].get<double>();
    if (!(v >= lo && v <= hi)) {
      return invalid_field(k, std::string("\"") + k + "\" must be between " + std::to_string(lo) + " and " + std::to_string(hi));
    }
    *out = static_cast<float>(v);
    return {};
  };
  for (ApiStatus e : {number("temperature", 0, 2, &p.sampling.temperature), number("top_p", 0, 1, &p.sampling.top_p),
                      number("min_p", 0, 1, &p.sampling.min_p),
                      number("repeat_penalty", 0, 10, &p.sampling.repeat_penalty),
                      number("presence_penalty", -kMaxAbsPenalty, kMaxAbsPenalty, &p.sampling.presence_penalty),
                      number("frequency_penalty", -kMaxAbsPenalty, kMaxAbsPenalty, &p.sampling.frequency_penalty)}) {
    if (!e.ok()) return e;
  }
  if (ApiStatus e = parse_logit_bias(svc, b, &p.sampling); !e.ok()) return e;
  if (ApiStatus e = parse_logprobs(b, api, &p.sampling); !e.ok()) return e;
  if (ApiStatus e = parse_response_format(svc, b, raw_body, &p.grammar); !e.ok()) return e;
  if (b.contains("top_k") && !b["top_k"].is_null()) {
    if (!b["top_k"].is_number_integer()) return invalid_field("top_k", "\"top_k\" must be an integer");
    p.sampling.top_k = b["top_k"].get<int>();
  }
  if (b.contains("seed") && !b["seed"].is_null()) {
    if (!b["seed"].is_number_integer()) return invalid_field("seed", "\"seed\" must be an integer");
    p.sampling.seed = b["seed"].is_number_unsigned() ? b["seed"].get<uint64_t>() : static_cast<uint64_t>(b["seed"].get<int64_t>());
  } else {
    // No seed: a fresh one, so that "regenerate" gives another reply; the reply's "towers.seed" says
    // which, to replay it.
    p.sampling.seed = random_seed();
  }
  p.max_tokens = svc.config.default_max_tokens;
  for (const char* k : {"max_tokens", "max_completion_tokens"}) {
    if (b.contains(k) && !b[k].is_null()) {
      if (!b[k].is_number_integer() || b[k].get<int64_t>() < 1) {
        return invalid_field(k, std::string("\"") + k + "\" must be a positive integer");
      }
      if (b[k].get<int64_t>() > svc.config.max_tokens) {
        return invalid_field(k, std::string("\"") + k + "\" of " + std::to_string(b[k].get<int64_t>()) +
                                    " exceeds this server's limit of " + std::to_string(svc.config.max_tokens) +
                                    " (limits.max_tokens)");
      }
      p.max_tokens = b[k].get<int>();
    }
  }
  if (b.contains("stop") && !b["stop"].is_null()) {
    const json& s = b["stop"];
    if (s.is_string()) {
      p.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 16 && std::all_of(s.begin(), s.end(), [](const json& e) { return e.is_string(); })) {
      for (const auto& e : s) p.stop.push_back(e.get<std::string>());
    } else {
      return invalid_field("stop", "\"stop\" must be a string or an array of at most 16 strings");
    }
  }
  if (b.contains("stream") && !b["stream"].is_null()) {
    if (!b["stream"].is_boolean()) return invalid_field("stream", "\"stream\" must be true or false");
    p.stream = b["stream"].get<bool>();
  }
  if (ApiStatus e = parse_stream_options(b, p.stream, &p.include_usage); !e.ok()) return e;
  if (b.contains("n") && !b["n"].is_null()) {
    const int64_t limit = svc.config.max_batch;
    if (!b["n"].is_number_integer() || b["n"].get<int64_t>() < 1 || b["n"].get<int64_t>() > limit) {
      return invalid_field("n", "\"n\" must be an integer from 1 to " + std::to_string(limit) + " (limits.max_batch)");
    }
    p.n = b["n"].get<int>();
  }
  for (const auto& s : svc.prompts.stop_strings()) p.stop.push_back(s);
  return {};
}

ApiStatus no_tools_with_session(const json& body) {
  if (body.contains("tools") && !body["tools"].is_null() && !is_empty(body["tools"])) {
    return ApiStatus(Status::Unimplemented("\"tools\" is not supported on /v1/sessions/ID/messages (its message is the user's "
                                           "text): a session's tools come with its first turn on /v1/chat/completions with "
                                           "\"session\""),
                     "tools");
  }
  return {};
}

ApiStatus one_choice(const GenParams& params) {
  if (params.n == 1) return {};
  return ApiStatus(Status::Unimplemented("\"n\" > 1 is not supported with a session (a session continues one transcript)"), "n");
}

namespace {

json model_json(const Service& svc) {
  return {{"id", svc.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "towerd"},
          {"context_length", svc.model.config().n_ctx_train}, {"aliases", svc.config.aliases}};
}

ApiStatus model_not_found(const std::string& name, const char* param) {
  return ApiStatus(Status::NotFound("the model \"" + name + "\" is not served here (towerd serves one model; see GET /v1/models)"),
                   param, "model_not_found");
}

// The decoding of a reply whose prompt holds `tools`: the tool-call grammar for tool_choice, and the
// reply parsed into calls in the family's format (nothing with "none" or no tools).
ApiStatus tool_decoding(Service& svc, const std::vector<ToolDefinition>& tools, const ToolRequest& request,
                        GenParams* params) {
  const ToolFormat format = tool_format_for(svc.prompts.family());
  auto gbnf = tool_call_gbnf(format, tools, request.choice, request.parallel ? 8 : 1);
  if (!gbnf.ok()) return ApiStatus(gbnf.status(), request.choice.mode == ToolChoice::Mode::Named ? "tool_choice" : "tools");
  if (!gbnf.value().empty()) {
    auto g = Grammar::parse(gbnf.value());
    if (!g.ok()) return ApiStatus(Status::Error("internal: the tool-call grammar does not parse: " + g.error()), "tools");
    params->grammar = std::make_shared<GrammarAutomaton>(g.value(), svc.token_trie());
  }
  if (request.choice.mode != ToolChoice::Mode::None && !tools.empty()) params->tool_format = format;
  return {};
}

ApiStatus no_tools_with_response_format(const GenParams& params) {
  if (!params.grammar) return {};
  return invalid_field("response_format", "\"response_format\" cannot be combined with \"tools\" (tool calls have their own grammar)");
}

// A chat request with tools (or tool calls and results in its history) without a session or bot: the
// conversation rendered in the model family's tool format (engine/constrained/tool_format.h) on the
// session-less path (the system block with the tools is a shared segment), and the tool-call grammar
// for tool_choice.
ApiStatus tool_generation(Service& svc, const std::vector<ToolChatMessage>& messages, const ToolRequest& tools,
                          const std::vector<int32_t>& reply_opening, GenParams* params, GenerationSpec* spec) {
  if (ApiStatus e = no_tools_with_response_format(*params); !e.ok()) return e;
  const ChatFamily family = svc.prompts.family();
  auto rendered = render_tool_messages(family, messages, tools.tools, tools.choice,
                                       chat_template_default_system(svc.model.tokenizer().chat_template()));
  if (!rendered.ok()) return ApiStatus(rendered.status(), "messages");
  auto conv = svc.prompts.conversation(rendered.value());
  if (!conv.ok()) return ApiStatus(conv.status(), "messages");
  if (ApiStatus e = tool_decoding(svc, tools.tools, tools, params); !e.ok()) return e;
  Catalog::Stateless st;
  st.base = std::move(conv.value().base);
  st.rest = std::move(conv.value().rest);
  st.rest.insert(st.rest.end(), reply_opening.begin(), reply_opening.end());
  st.prompt_estimate = st.base.size() + st.rest.size();
  *spec = stateless_spec(std::move(st));
  return {};
}

// A bot's conversation with tools (or tool calls and results in its history), without a session: the
// bot's chain and the tools' segments as a session with these tools has them (daemon/catalog.h,
// "Tools on sessions"), then the conversation in the family's tool format.
ApiStatus bot_tool_generation(Service& svc, const std::string& bot, const std::vector<ToolChatMessage>& messages,
                              const ToolRequest& tools, const std::vector<int32_t>& reply_opening, GenParams* params,
                              GenerationSpec* spec) {
  if (ApiStatus e = no_tools_with_response_format(*params); !e.ok()) return e;
  if (!messages.empty() && messages[0].role == "system") {
    return invalid_field("messages", "the bot's segments are the system prompt: remove the system message or the bot");
  }
  auto rendered = render_tool_messages(svc.prompts.family(), messages, {}, ToolChoice{ToolChoice::Mode::None, ""}, "");
  if (!rendered.ok()) return ApiStatus(rendered.status(), "messages");
  const std::string tools_text = tools.tools.empty() ? "" : tools_json(tools.tools);
  auto begun = svc.catalog.begin_stateless(bot, std::move(rendered.value()), tools_text);
  if (!begun.ok()) return not_found_as(begun.status(), "segment_not_found", "bot");
  if (ApiStatus e = tool_decoding(svc, tools.tools, tools, params); !e.ok()) return e;
  begun->rest.insert(begun->rest.end(), reply_opening.begin(), reply_opening.end());
  begun->prompt_estimate += reply_opening.size();
  *spec = stateless_spec(std::move(begun.value()));
  spec->extra = {{"bot", bot}};
  return {};
}

}  // namespace

namespace {

// Tool-call arguments as JSON values where both parse (a client re-serialises the model's text).
bool same_arguments(const std::string& a, const std::string& b) {
  const json x = json::parse(a, nullptr, false), y = json::parse(b, nullptr, false);
  return x.is_discarded() || y.is_discarded() ? a == b : x == y;
}

// Whether a request's message is a session's kept one as transcript_json writes it: the same role and
// text, the same calls (names and arguments; not their ids, which the kept view only knows once
// answered), and a tool message's tool_call_id. `name` is not rendered, so not compared.
bool same_message(const ToolChatMessage& m, const json& kept) {
  const std::string content = kept["content"].is_string() ? kept["content"].get<std::string>() : "";
  if (m.role != kept["role"] || m.content != content) return false;
  if (m.role == "tool") return kept.value("tool_call_id", "") == m.tool_call_id;
  const json calls = kept.value("tool_calls", json::array());
  if (calls.size() != m.tool_calls.size()) return false;
  for (size_t k = 0; k < calls.size(); ++k) {
    const json& f = calls[k]["function"];
    if (f["name"] != m.tool_calls[k].name || !same_arguments(f["arguments"].get<std::string>(), m.tool_calls[k].arguments)) {
      return false;
    }
  }
  return true;
}

// A request with `session` that sends the whole conversation (what the AI SDK and LangChain do on
// every step of a tool loop): `history`, the messages before the new ones, must be the session's
// kept messages (and when it dropped turns to stay within the context, may begin with the dropped
// ones). Returns the session's turn count the check saw, to confirm that the turn continues it.
Result<uint64_t> check_session_history(Service& svc, const std::string& session, std::span<const ToolChatMessage> history) {
  auto s = svc.catalog.session(session, true);
  if (!s.ok()) return s.status();
  const json kept = transcript_json(*s->transcript, s->tool_format);
  const bool dropped = s->transcript->size() < 2 * s->turns;
  bool same = dropped ? history.size() >= kept.size() : history.size() == kept.size();
  const size_t skip = history.size() - std::min(history.size(), kept.size());
  for (size_t i = 0; same && i < kept.size(); ++i) same = same_message(history[skip + i], kept[i]);
  if (!same) {
    return Status::InvalidArgument("the " + std::to_string(history.size()) + " messages before the new one are not the " +
                                   std::to_string(kept.size()) + " that session \"" + session + "\" holds: send the new message " +
                                   "alone, or after the whole conversation so far");
  }
  return s->turns;
}

}  // namespace

ApiStatus session_generation(Service& svc, const std::string& session, const std::vector<ToolChatMessage>& messages,
                             const ToolRequest& tools, const std::string& session_param, GenParams* params,
                             GenerationSpec* spec) {
  if (ApiStatus e = one_choice(*params); !e.ok()) return e;
  // The session holds the history: the request brings what is new, the user's message or the tool
  // results, alone or after the conversation so far, which must then be the session's (checked, never
  // merged into the transcript or dropped behind the client's back).
  const size_t fresh = new_turn_messages(messages);
  if (fresh == 0) {
    return invalid_field("messages", "with \"session\", \"messages\" must end with the new message, the user's, or the tool "
                                     "messages answering the last reply's tool calls (the session keeps the history; got " +
                                     std::to_string(messages.size()) + " messages" +
                                     (messages.empty() ? "" : ", the last a " + messages.back().role + " message") + ")");
  }
  const std::span<const ToolChatMessage> history(messages.data(), messages.size() - fresh);
  std::optional<uint64_t> turns_seen;
  if (!history.empty()) {
    auto seen = check_session_history(svc, session, history);
    if (!seen.ok()) {
      return seen.status().code() == Status::Code::kNotFound ? not_found_as(seen.status(), "session_not_found", session_param)
                                                             : ApiStatus(seen.status(), "messages");
    }
    turns_seen = seen.value();
  }
  const std::span<const ToolChatMessage> added(messages.data() + history.size(), fresh);
  const bool user = added[0].role == "user";
  if (!tools.tools.empty()) {
    if (ApiStatus e = no_tools_with_response_format(*params); !e.ok()) return e;
  }
  Catalog::TurnInput input;
  input.role = user ? "user" : "tool";
  input.content = user ? added[0].content : tool_results_json(added);
  input.tools = tools.tools.empty() ? "" : tools_json(tools.tools);
  if (ApiStatus e = begin_session_turn(svc, session, input, *params, session_param, spec); !e.ok()) return e;
  if (turns_seen && spec->session_turn()->number != *turns_seen + 1) {  // another turn came between
    svc.catalog.abort_turn(session);
    return ApiStatus(Status::Conflict("session \"" + session + "\" had another turn while this request was read: send it again"),
                     session_param);
  }
  const std::string& session_tools = spec->session_turn()->tools;
  const bool asks = tools.choice.mode == ToolChoice::Mode::Required || tools.choice.mode == ToolChoice::Mode::Named;
  if (session_tools.empty() && asks) {
    svc.catalog.abort_turn(session);
    return invalid_field("tool_choice", "\"tool_choice\" asks for a tool call but neither the request nor the session has tools");
  }
  if (session_tools.empty() || params->grammar) return {};  // no tools, or response_format's grammar
  auto defs = parse_tools_json(session_tools);
  ApiStatus e = defs.ok() ? tool_decoding(svc, defs.value(), tools, params) : ApiStatus(defs.status(), "tools");
  if (!e.ok()) svc.catalog.abort_turn(session);
  return e;
}

namespace {

// A generation request's body, parsed once: what /v1/chat/completions and /v1/completions share (the
// model, the sampling and limits) and each one's own fields.
struct GenerationRequest {
  GenParams params;
  // Chat: the conversation, and Towers' extra fields; tools and tool calls in the history.
  std::vector<ToolChatMessage> messages;
  std::string session, bot;
  ToolRequest tools;
  bool tool_history = false;
  bool enable_thinking = true;  // chat_template_kwargs.enable_thinking
  // Completions: the prompt text, as it is.
  std::string prompt;
};

// "chat_template_kwargs", as llama-server takes it: the template switches of a request. Only
// enable_thinking (a boolean; Qwen3's templates read it) is known; another key is refused by name.
ApiStatus parse_template_kwargs(const json& body, bool* enable_thinking) {
  if (!body.contains("chat_template_kwargs") || body["chat_template_kwargs"].is_null()) return {};
  const json& kwargs = body["chat_template_kwargs"];
  if (!kwargs.is_object()) return invalid_field("chat_template_kwargs", "\"chat_template_kwargs\" must be an object");
  for (const auto& [key, v] : kwargs.items()) {
    const std::string where = "chat_template_kwargs." + key;
    if (key != "enable_thinking") {
      return ApiStatus(Status::Unimplemented("\"" + where + "\" is not supported by towerd (supported: enable_thinking)"),
                       where);
    }
    if (!v.is_boolean()) return invalid_field(where, "\"" + where + "\" must be true or false");
    *enable_thinking = v.get<bool>();
  }
  return {};
}

ApiStatus parse_chat_request(const Service& svc, const HttpRequest& req, GenerationRequest* r) {
  json body;
  if (ApiStatus e = parse_body(req, &body); !e.ok()) return e;
  if (ApiStatus e = check_generation_fields(body, {"model", "messages", "session", "bot", "chat_template_kwargs"});
      !e.ok()) {
    return e;
  }
  if (ApiStatus e = parse_template_kwargs(body, &r->enable_thinking); !e.ok()) return e;
  for (ApiStatus e : {check_model(svc, body), string_field(body, "session", false, &r->session),
                      string_field(body, "bot", false, &r->bot)}) {
    if (!e.ok()) return e;
  }
  if (ApiStatus e = parse_gen_params(svc, body, ReplyApi::Chat, &r->params, req.body); !e.ok()) return e;
  if (ApiStatus e = parse_messages(body, &r->messages); !e.ok()) return e;
  // Tool schemas keep the client's key order: the body parsed once more, in order, only when it has tools.
  const auto ordered = body.contains("tools") ? nlohmann::ordered_json::parse(req.body, nullptr, /*allow_exceptions=*/false)
                                              : nlohmann::ordered_json();
  if (ApiStatus e = parse_tools(body, ordered, !r->session.empty(), &r->tools); !e.ok()) return e;
  r->tool_history = std::any_of(r->messages.begin(), r->messages.end(), [](const ToolChatMessage& m) {
    return m.role == "tool" || !m.tool_calls.empty();
  });
  return {};
}

// "prompt" (one string), and the legacy API's own fields: "logprobs" is a count here (the chat API's
// is a boolean), "echo", "suffix" and "best_of" only with the values that ask for nothing.
ApiStatus parse_completion_request(const Service& svc, const HttpRequest& req, GenerationRequest* r) {
  json body;
  if (ApiStatus e = parse_body(req, &body); !e.ok()) return e;
  if (body.contains("top_logprobs")) {
    return ApiStatus(Status::InvalidArgument("unknown field \"top_logprobs\" (completions take \"logprobs\": N)"),
                     "top_logprobs", "unknown_parameter");
  }
  for (const char* chat_only : {"tools", "tool_choice", "parallel_tool_calls", "response_format", "modalities", "audio"}) {
    if (body.contains(chat_only)) {
      return ApiStatus(Status::InvalidArgument(std::string("unknown field \"") + chat_only + "\" (a chat completions field)"),
                       chat_only, "unknown_parameter");
    }
  }
  if (ApiStatus e = check_generation_fields(body, {"model", "prompt", "echo", "suffix", "best_of"}); !e.ok()) {
    return e;
  }
  if (body.contains("echo") && !body["echo"].is_null() && body["echo"] != false) {
    return ApiStatus(Status::Unimplemented("\"echo\" is not supported by towerd (accepted: false)"), "echo");
  }
  if (body.contains("suffix") && !body["suffix"].is_null() && body["suffix"] != "") {
    return ApiStatus(Status::Unimplemented("\"suffix\" is not supported by towerd (accepted: null, \"\")"), "suffix");
  }
  if (ApiStatus e = check_model(svc, body); !e.ok()) return e;
  if (ApiStatus e = parse_gen_params(svc, body, ReplyApi::Completions, &r->params, req.body); !e.ok()) return e;
  if (body.contains("best_of") && !body["best_of"].is_null() && body["best_of"] != r->params.n) {
    return ApiStatus(Status::Unimplemented("\"best_of\" is not supported by towerd (accepted: null, or equal to n)"), "best_of");
  }
  if (!body.contains("prompt") || !body["prompt"].is_string()) {
    if (body.contains("prompt") && body["prompt"].is_array()) {
      return ApiStatus(Status::Unimplemented("\"prompt\" must be one string: arrays (of strings or token ids) are not supported"),
                       "prompt");
    }
    return invalid_field("prompt", "\"prompt\" is required and must be a string");
  }
  r->prompt = body["prompt"].get<std::string>();
  return {};
}

}  // namespace

ApiStatus check_model(const Service& svc, const json& body) {
  std::string model;
  if (ApiStatus e = string_field(body, "model", false, &model); !e.ok()) return e;
  return svc.serves(model) ? ApiStatus() : model_not_found(model, "model");
}

ApiStatus handle_models(Service& svc, const HttpRequest&, HttpResponder& out, const std::string& name) {
  if (name.empty()) return reply(out, {{"object", "list"}, {"data", json::array({model_json(svc)})}});
  if (!svc.serves(name)) return model_not_found(name, "");
  return reply(out, model_json(svc));
}

ApiStatus handle_chat_completions(Service& svc, const HttpRequest& req, HttpResponder& out, const std::string&) {
  GenerationRequest r;
  if (ApiStatus e = parse_chat_request(svc, req, &r); !e.ok()) return e;
  GenerationSpec spec;
  // Thinking off: the reply opens with the template's empty reasoning block (nothing for templates
  // without the switch).
  const std::vector<int32_t> reply_opening = r.enable_thinking ? std::vector<int32_t>() : svc.prompts.thinking_off();
  const bool tools = !r.tools.tools.empty() || r.tool_history;
  if (!r.session.empty()) {
    if (!reply_opening.empty()) {
      return ApiStatus(Status::Unimplemented("\"chat_template_kwargs.enable_thinking\": false is not supported with "
                                             "\"session\" (a session's transcript keeps its turns as generated): send "
                                             "the conversation without it"),
                       "chat_template_kwargs.enable_thinking");
    }
    if (ApiStatus e = session_generation(svc, r.session, r.messages, r.tools, "session", &r.params, &spec); !e.ok()) {
      return e;
    }
  } else if (tools && !r.bot.empty()) {
    if (ApiStatus e = bot_tool_generation(svc, r.bot, r.messages, r.tools, reply_opening, &r.params, &spec); !e.ok()) {
      return e;
    }
  } else if (tools) {
    if (ApiStatus e = tool_generation(svc, r.messages, r.tools, reply_opening, &r.params, &spec); !e.ok()) return e;
  } else {
    if (ApiStatus e = check_turn_order(r.messages); !e.ok()) return e;
    std::vector<ChatMessage> chat;
    for (auto& m : r.messages) chat.push_back({std::move(m.role), std::move(m.content)});
    auto begun = svc.catalog.begin_stateless(r.bot, std::move(chat));
    if (!begun.ok()) return not_found_as(begun.status(), "segment_not_found", "bot");
    begun->rest.insert(begun->rest.end(), reply_opening.begin(), reply_opening.end());
    begun->prompt_estimate += reply_opening.size();
    spec = stateless_spec(std::move(begun.value()));
    if (!r.bot.empty()) spec.extra = {{"bot", r.bot}};
  }
  spec.params = std::move(r.params);
  return run_generation(svc, out, std::move(spec));
}

// POST /v1/completions: the prompt text as it is (no chat template; BOS as the model adds it), on the
// session-less path, so a prompt that begins like an earlier one reuses its KV.
ApiStatus handle_completions(Service& svc, const HttpRequest& req, HttpResponder& out, const std::string&) {
  GenerationRequest r;
  if (ApiStatus e = parse_completion_request(svc, req, &r); !e.ok()) return e;
  const Tokenizer& tok = svc.model.tokenizer();
  Catalog::Stateless st;
  st.rest = tok.encode(r.prompt, tok.add_bos_default(), /*parse_special=*/false);
  if (st.rest.empty()) return invalid_field("prompt", "\"prompt\" is empty and this model adds no BOS token");
  st.prompt_estimate = st.rest.size();
  GenerationSpec spec = stateless_spec(std::move(st));
  spec.api = ReplyApi::Completions;
  spec.params = std::move(r.params);
  return run_generation(svc, out, std::move(spec));
}

}  // namespace api
}  // namespace towers::daemon
