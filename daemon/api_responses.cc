// POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API, where a response is a
// turn of a towerd session. A first response creates a session (under `bot`, or under the
// instructions' own bot: api_responses.h), previous_response_id continues the session it names with
// only the new input prefilled, and "store": false runs on the session-less path and keeps nothing.
// The request is parsed here into the chat path's GenParams; the generation runs as every other
// (run_generation) and answers with daemon/api_response_reply.h's objects.
#include "daemon/api_responses.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <ctime>

#include "daemon/log.h"
#include "daemon/random_id.h"
#include "daemon/service.h"
#include "daemon/turns.h"
#include "daemon/api_response_reply.h"
#include "mmapstore/segment_file.h"

namespace towers::daemon::api {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string response_id(const std::string& session, uint64_t turn) {
  return "resp_" + session + "_" + std::to_string(turn);
}

std::optional<ResponseRef> parse_response_id(std::string_view id) {
  constexpr std::string_view prefix = "resp_";
  if (!id.starts_with(prefix)) return std::nullopt;
  id.remove_prefix(prefix.size());
  const size_t cut = id.rfind('_');
  if (cut == std::string_view::npos || cut == 0 || cut + 1 == id.size() || id.size() - cut > 20) return std::nullopt;
  ResponseRef ref{std::string(id.substr(0, cut)), 0};
  for (char c : id.substr(cut + 1)) {
    if (c < '0' || c > '9') return std::nullopt;
    ref.turn = ref.turn * 10 + static_cast<uint64_t>(c - '0');
  }
  if (ref.turn == 0) return std::nullopt;
  return ref;
}

std::string instructions_bot(const std::string& instructions) {
  const uint64_t h = xxh3_64({reinterpret_cast<const uint8_t*>(instructions.data()), instructions.size()});
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string(kResponsesPlatform) + "." + hex;
}

std::optional<ResponseRef> parse_item_id(std::string_view id) {
  constexpr std::string_view prefix = "msg_";
  if (!id.starts_with(prefix)) return std::nullopt;
  return parse_response_id("resp_" + std::string(id.substr(prefix.size())));
}

std::optional<ResponseRef> parse_call_id(std::string_view call_id) {
  constexpr std::string_view prefix = "call_";
  const size_t cut = call_id.rfind('_');
  if (!call_id.starts_with(prefix) || cut == std::string_view::npos || cut <= prefix.size() || cut + 1 == call_id.size() ||
      call_id.find_first_not_of("0123456789", cut + 1) != std::string_view::npos) {
    return std::nullopt;
  }
  return parse_response_id("resp_" + std::string(call_id.substr(prefix.size(), cut - prefix.size())));
}

bool is_instructions_bot(std::string_view bot) {
  return bot.size() == kResponsesPlatform.size() + 17 && bot.starts_with(kResponsesPlatform) &&
         bot[kResponsesPlatform.size()] == '.';
}

namespace {

ApiStatus unsupported(const std::string& param, const std::string& why) {
  return ApiStatus(Status::Unimplemented(why), param);
}

// One input message's text: a string, or parts of type input_text / output_text.
ApiStatus message_text(const json& item, const std::string& at, std::string* out) {
  if (!item.contains("content") || item["content"].is_null()) return invalid_field(at + ".content", at + ".content is missing");
  const json& c = item["content"];
  if (c.is_string()) {
    *out = c.get<std::string>();
    return {};
  }
  if (!c.is_array()) return invalid_field(at + ".content", at + ".content must be a string or an array of text parts");
  out->clear();
  for (size_t j = 0; j < c.size(); ++j) {
    const std::string pat = at + ".content[" + std::to_string(j) + "]";
    const json& part = c[j];
    const std::string type = part.is_object() && part.contains("type") && part["type"].is_string() ? part["type"].get<std::string>() : "";
    if (type != "input_text" && type != "output_text") {
      return unsupported(pat + ".type", pat + ".type \"" + type + "\" is not supported: only text parts (input_text, output_text)");
    }
    if (!part.contains("text") || !part["text"].is_string()) return invalid_field(pat + ".text", pat + ".text must be a string");
    *out += part["text"].get<std::string>();
  }
  return {};
}

// A message item: {"type": "message" (or absent), "role", "content", "id"?, "status"?}.
ApiStatus parse_message_item(const json& item, const std::string& at, std::vector<std::string>* system, ResponseInput* out) {
  if (!item.contains("role") || !item["role"].is_string()) return invalid_field(at + ".role", at + ".role must be a string");
  const std::string role = item["role"].get<std::string>();
  if (role != "user" && role != "assistant" && role != "system" && role != "developer") {
    return unsupported(at + ".role", at + ".role \"" + role + "\" is not supported (user, assistant, system, developer)");
  }
  for (const auto& [k, v] : item.items()) {
    if (k != "type" && k != "role" && k != "content" && k != "id" && k != "status" && !v.is_null()) {
      return unsupported(at + "." + k, at + "." + k + " is not supported (a message item has a role and a content)");
    }
  }
  std::string text;
  if (ApiStatus e = message_text(item, at, &text); !e.ok()) return e;
  if (role == "system" || role == "developer") {
    system->push_back(std::move(text));
  } else {
    out->messages.push_back({role, std::move(text)});
    out->references.emplace_back();
  }
  return {};
}

// A function_call item: a call of the assistant message it follows (a new one, empty, if the item
// before was not an assistant's).
void add_call(ToolCall call, ResponseInput* out) {
  if (out->messages.empty() || out->messages.back().role != "assistant") {
    out->messages.push_back({"assistant", ""});
    out->references.emplace_back();
  }
  out->calls.resize(out->messages.size());
  out->calls.back().push_back(std::move(call));
}

}  // namespace

ApiStatus parse_response_input(const json& body, ResponseInput* out) {
  std::vector<std::string> system;
  if (body.contains("instructions") && !body["instructions"].is_null()) {
    if (!body["instructions"].is_string()) return invalid_field("instructions", "\"instructions\" must be a string");
    system.push_back(body["instructions"].get<std::string>());
  }
  if (!body.contains("input") || body["input"].is_null()) return invalid_field("input", "\"input\" is required");
  const json& input = body["input"];
  if (input.is_string()) {
    out->messages.push_back({"user", input.get<std::string>()});
    out->references.emplace_back();
  } else if (input.is_array()) {
    for (size_t i = 0; i < input.size(); ++i) {
      const std::string at = "input[" + std::to_string(i) + "]";
      const json& item = input[i];
      if (!item.is_object()) return invalid_field(at, at + " must be an object");
      const std::string type = item.contains("type") && item["type"].is_string() ? item["type"].get<std::string>() : "message";
      if (type == "message") {
        if (ApiStatus e = parse_message_item(item, at, &system, out); !e.ok()) return e;
      } else if (type == "function_call_output") {
        if (!item.contains("call_id") || !item["call_id"].is_string()) return invalid_field(at + ".call_id", at + ".call_id must be a string");
        if (!item.contains("output") || !item["output"].is_string()) {
          return invalid_field(at + ".output", at + ".output must be a string (the function's result)");
        }
        out->messages.push_back({"tool", item["output"].get<std::string>()});
        out->references.emplace_back();
        out->call_ids.resize(out->messages.size());
        out->call_ids.back() = item["call_id"].get<std::string>();
      } else if (type == "function_call") {
        ToolCall call;
        for (auto [key, field] : {std::pair{"call_id", &call.id}, {"name", &call.name}, {"arguments", &call.arguments}}) {
          if (!item.contains(key) || !item[key].is_string()) return invalid_field(at + "." + key, at + "." + key + " must be a string");
          *field = item[key].get<std::string>();
        }
        add_call(std::move(call), out);
      } else if (type == "item_reference") {
        if (!item.contains("id") || !item["id"].is_string()) return invalid_field(at + ".id", at + ".id must be a string");
        const std::string id = item["id"].get<std::string>();
        if (id.starts_with("fc_") && parse_call_id("call_" + id.substr(3))) {
          // A function call item of a towerd response: a call of the assistant message before it,
          // its name and arguments read from the session (resolve_references).
          add_call({id, "", ""}, out);
          continue;
        }
        if (!parse_item_id(id)) {
          return unsupported(at + ".id", at + ".id \"" + id + "\": only the items of towerd's responses (msg_<session>_<turn>, "
                                         "fc_<session>_<turn>_<k>) can be referenced");
        }
        out->messages.push_back({"assistant", ""});
        out->references.push_back(id);
      } else {
        return unsupported(at + ".type", at + ".type \"" + type + "\" is not supported (message items with text)");
      }
    }
  } else {
    return invalid_field("input", "\"input\" must be a string or an array of items");
  }
  if (out->messages.empty()) return invalid_field("input", "\"input\" holds no user message");
  out->call_ids.resize(out->messages.size());
  out->calls.resize(out->messages.size());
  if (!system.empty()) {
    std::string joined;
    for (const auto& s : system) joined += (joined.empty() ? "" : "\n\n") + s;
    out->system = std::move(joined);
  }
  return {};
}

namespace {

// What becomes of a field of a Responses body.
enum class Kind {
  Chat,     // the chat completions field of the same name (parse_gen_params reads it)
  Own,      // read here (input, text, ...)
  Refused,  // not supported unless null or its neutral value
};
struct ResponsesField {
  std::string_view name;
  Kind kind;
  bool (*neutral)(const json&) = nullptr;  // Refused: the values accepted (they ask for nothing)
  std::string_view accepted = "";
};

bool never(const json&) { return false; }
bool is_false(const json& v) { return v == false; }
bool empty_array(const json& v) { return v.is_array() && v.empty(); }
bool zero(const json& v) { return v == 0; }
// "reasoning": {} or {"effort": null, "summary": null} (what clients send for a model that does not reason).
bool no_reasoning(const json& v) {
  return v.is_object() && std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_null(); });
}

constexpr ResponsesField kResponsesFields[] = {
    {"model", Kind::Chat},
    {"temperature", Kind::Chat},
    {"top_p", Kind::Chat},
    {"seed", Kind::Chat},  // a Towers extension, as on chat completions
    {"stream", Kind::Chat},
    {"user", Kind::Chat},
    {"metadata", Kind::Chat},
    {"safety_identifier", Kind::Chat},
    {"prompt_cache_key", Kind::Chat},
    {"service_tier", Kind::Chat},
    {"input", Kind::Own},
    {"instructions", Kind::Own},
    {"previous_response_id", Kind::Own},
    {"store", Kind::Own},
    {"bot", Kind::Own},  // a Towers extension: the first response's session is under this bot
    {"max_output_tokens", Kind::Own},
    {"text", Kind::Own},
    {"stream_options", Kind::Own},
    {"tools", Kind::Own},
    {"tool_choice", Kind::Own},
    {"parallel_tool_calls", Kind::Own},
    {"include", Kind::Refused, empty_array, "[]"},
    {"reasoning", Kind::Refused, no_reasoning, "{} (the model does not reason)"},
    {"background", Kind::Refused, is_false, "false"},
    {"truncation", Kind::Refused, never, "null: a session drops its oldest turns as [limits] overflow says"},
    {"max_tool_calls", Kind::Refused, never, "null"},
    {"top_logprobs", Kind::Refused, zero, "0"},
    {"conversation", Kind::Refused, never, "null: continue with previous_response_id"},
    {"prompt", Kind::Refused, never, "null"},
};

// "text": {"format": {"type": "text" | "json_object" | "json_schema", "name", "schema", "strict",
// "description"}, "verbosity"} -> "response_format".
ApiStatus text_format(const ojson& text, ojson* chat) {
  if (!text.is_object()) return invalid_field("text", "\"text\" must be an object");
  for (const auto& [k, v] : text.items()) {
    if (k == "verbosity") {
      if (!v.is_null() && v != "medium") return unsupported("text.verbosity", "\"text.verbosity\" is not supported by towerd (accepted: \"medium\")");
    } else if (k != "format") {
      return ApiStatus(Status::InvalidArgument("unknown field \"text." + k + "\""), "text." + k, "unknown_parameter");
    }
  }
  if (!text.contains("format") || text["format"].is_null()) return {};
  const ojson& f = text["format"];
  const std::string type = f.is_object() && f.contains("type") && f["type"].is_string() ? f["type"].get<std::string>() : "";
  if (type == "text" || type == "json_object") {
    (*chat)["response_format"] = {{"type", type}};
    return {};
  }
  if (type != "json_schema") {
    return invalid_field("text.format.type", "text.format.type must be \"text\", \"json_object\" or \"json_schema\"");
  }
  ojson schema = ojson::object();
  for (const auto& [k, v] : f.items()) {
    if (k == "name" || k == "schema" || k == "strict" || k == "description") schema[k] = v;
    else if (k != "type") return ApiStatus(Status::InvalidArgument("unknown field \"text.format." + k + "\""), "text.format." + k, "unknown_parameter");
  }
  (*chat)["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
  return {};
}

// The Responses API's tool fields as the chat API's: "tools": [{"type": "function", "name",
// "description", "parameters", "strict"}] -> [{"type": "function", "function": {...}}]; "tool_choice"
// {"type": "function", "name"} -> {"type": "function", "function": {"name"}}; other tool types
// (web_search, file_search, ...) are refused by name.
ApiStatus responses_tools(const ojson& body, ojson* chat) {
  if (body.contains("tools") && !body["tools"].is_null()) {
    const ojson& ts = body["tools"];
    if (!ts.is_array()) return invalid_field("tools", "\"tools\" must be an array");
    ojson tools = ojson::array();
    for (size_t i = 0; i < ts.size(); ++i) {
      const std::string at = "tools[" + std::to_string(i) + "]";
      const ojson& t = ts[i];
      const std::string type = t.is_object() && t.contains("type") && t["type"].is_string() ? t["type"].get<std::string>() : "";
      if (type != "function") return unsupported(at + ".type", at + ".type \"" + type + "\" is not supported: only \"function\" tools");
      ojson f = ojson::object();
      for (const auto& item : t.items()) {
        if (item.key() != "type") f[item.key()] = item.value();
      }
      tools.push_back({{"type", "function"}, {"function", std::move(f)}});
    }
    (*chat)["tools"] = std::move(tools);
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const ojson& c = body["tool_choice"];
    if (c.is_object() && c.value("type", "") == "function" && c.contains("name")) {
      (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", c["name"]}}}};
    } else if (c.is_string()) {
      (*chat)["tool_choice"] = c;
    } else {
      return unsupported("tool_choice", "\"tool_choice\" must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\"}");
    }
  }
  if (body.contains("parallel_tool_calls")) (*chat)["parallel_tool_calls"] = body["parallel_tool_calls"];
  return {};
}

// "stream_options": {"include_obfuscation": bool}, only with "stream": true (no event is padded here).
ApiStatus stream_options(const ojson& body) {
  if (!body.contains("stream_options") || body["stream_options"].is_null()) return {};
  const ojson& o = body["stream_options"];
  if (!o.is_object()) return invalid_field("stream_options", "\"stream_options\" must be an object");
  if (body.value("stream", false) != true) return invalid_field("stream_options", "\"stream_options\" is only allowed with \"stream\": true");
  for (const auto& [k, v] : o.items()) {
    if (k != "include_obfuscation") {
      return ApiStatus(Status::InvalidArgument("unknown field \"stream_options." + k + "\""), "stream_options." + k, "unknown_parameter");
    }
    if (!v.is_boolean() && !v.is_null()) return invalid_field("stream_options." + k, "\"stream_options." + k + "\" must be true or false");
  }
  return {};
}

}  // namespace

ApiStatus responses_chat_body(const ojson& body, ojson* chat) {
  *chat = ojson::object();
  for (const auto& item : body.items()) {
    const std::string& k = item.key();  // not a structured binding: clang 14 cannot capture one
    const auto& v = item.value();
    const auto* rule = std::find_if(std::begin(kResponsesFields), std::end(kResponsesFields),
                                    [&](const ResponsesField& f) { return f.name == k; });
    if (rule == std::end(kResponsesFields)) {
      return ApiStatus(Status::InvalidArgument("unknown field \"" + k + "\""), k, "unknown_parameter");
    }
    if (rule->kind == Kind::Chat) (*chat)[k] = v;
    if (rule->kind == Kind::Refused && !v.is_null() && !rule->neutral(json::parse(v.dump()))) {
      return unsupported(k, "\"" + k + "\" is not supported by towerd (accepted: " + std::string(rule->accepted) + ")");
    }
  }
  if (body.contains("max_output_tokens")) (*chat)["max_tokens"] = body["max_output_tokens"];
  if (body.contains("text") && !body["text"].is_null()) {
    if (ApiStatus e = text_format(body["text"], chat); !e.ok()) return e;
  }
  if (ApiStatus e = responses_tools(body, chat); !e.ok()) return e;
  return stream_options(body);
}

ApiStatus as_responses_error(ApiStatus e) {
  // The field as a param, and as the message quotes it ("limits.max_tokens", a config key, stays).
  auto rename = [](std::string s, bool quoted) {
    const std::string q = quoted ? "\"" : "";
    for (auto [from, to] : {std::pair<std::string, std::string>{q + "max_tokens" + q, q + "max_output_tokens" + q},
                            {"response_format.json_schema.", "text.format."},
                            {"response_format", "text.format"},
                            {"].function.", "]."}}) {
      for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
    }
    return s;
  };
  if (e.ok()) return e;
  return ApiStatus(Status::WithCode(e.status.code(), rename(e.status.message(), true)), rename(e.param, false), e.code);
}

namespace {

// A session's tools (tools_json) as the Responses API writes them: [{"type": "function", "name", ...}].
json responses_tools_json(const std::string& tools) {
  json out = json::array();
  const json defs = tools.empty() ? json::array() : json::parse(tools, nullptr, /*allow_exceptions=*/false);
  if (!defs.is_array()) return out;
  for (const auto& f : defs) {
    json t = {{"type", "function"}};
    t.update(f);
    out.push_back(std::move(t));
  }
  return out;
}

// As a response shows them: null when there are none.
json instructions_json(const std::optional<std::string>& instructions) {
  return instructions && !instructions->empty() ? json(*instructions) : json(nullptr);
}

// A POST /v1/responses body, parsed once.
struct ResponsesRequest {
  GenParams params;
  ToolRequest tools;
  ResponseInput input;
  std::string previous, bot;
  bool store = true;
  bool whole_conversation = false;  // input holds the session's conversation before the new input
  json base;  // the response object's fields the request sets (echoed as OpenAI echoes them)
};

ApiStatus parse_responses_request(const Service& svc, const HttpRequest& req, ResponsesRequest* r) {
  json body;
  if (ApiStatus e = parse_body(req, &body); !e.ok()) return e;
  const ojson ordered = ojson::parse(req.body, nullptr, /*allow_exceptions=*/false);
  ojson chat;
  if (ApiStatus e = responses_chat_body(ordered, &chat); !e.ok()) return e;
  for (ApiStatus e : {check_model(svc, body), string_field(body, "previous_response_id", false, &r->previous),
                      string_field(body, "bot", false, &r->bot)}) {
    if (!e.ok()) return e;
  }
  if (body.contains("store") && !body["store"].is_null()) {
    if (!body["store"].is_boolean()) return invalid_field("store", "\"store\" must be true or false");
    r->store = body["store"].get<bool>();
  }
  if (ApiStatus e = parse_response_input(body, &r->input); !e.ok()) return e;
  const std::string chat_text = chat.dump();
  const json chat_body = json::parse(chat_text);
  if (ApiStatus e = parse_gen_params(svc, chat_body, ReplyApi::Chat, &r->params, chat_text); !e.ok()) {
    return as_responses_error(e);
  }
  // A stored response's session may have tools of its own (a call asked for without tools means them).
  if (ApiStatus e = parse_tools(chat_body, chat, r->store, &r->tools); !e.ok()) return as_responses_error(e);
  auto given = [&](const char* k, json otherwise) { return body.contains(k) && !body[k].is_null() ? body[k] : otherwise; };
  r->base = {{"created_at", static_cast<int64_t>(std::time(nullptr))},
             {"model", svc.model_id},
             {"instructions", instructions_json(r->input.system)},
             {"previous_response_id", r->previous.empty() ? json(nullptr) : json(r->previous)},
             {"max_output_tokens", given("max_output_tokens", nullptr)},
             {"temperature", given("temperature", r->params.sampling.temperature)},
             {"top_p", given("top_p", r->params.sampling.top_p)},
             {"text", given("text", {{"format", {{"type", "text"}}}})},
             {"store", r->store},
             {"tools", given("tools", json::array())},
             {"tool_choice", given("tool_choice", "auto")},
             {"parallel_tool_calls", given("parallel_tool_calls", true)},
             {"truncation", "disabled"},
             {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
             {"metadata", given("metadata", json::object())},
             {"user", given("user", nullptr)}};
  return {};
}

ApiStatus response_not_found(const std::string& id, const std::string& why, const std::string& param) {
  return ApiStatus(Status::NotFound("response \"" + id + "\" does not exist" + why), param, "response_not_found");
}

// The session turn a response id names, with the session's kept messages: the turn's user message
// is (*messages)[*at], its reply the next one.
struct Located {
  ResponseRef ref;
  SessionView session;
  size_t at = 0;
};
ApiStatus locate_response(Service& svc, const std::string& id, const std::string& param, Located* out) {
  auto ref = parse_response_id(id);
  if (!ref) return response_not_found(id, " (towerd's response ids are resp_<session>_<turn>; a \"store\": false response is not kept)", param);
  auto s = svc.catalog.session(ref->session, true);
  if (!s.ok()) return response_not_found(id, " (its session \"" + ref->session + "\" does not exist)", param);
  const uint64_t kept = s->transcript->size() / 2;
  if (ref->turn > s->turns) return response_not_found(id, " (session \"" + ref->session + "\" has " + std::to_string(s->turns) + " turns)", param);
  if (ref->turn + kept <= s->turns || s->transcript->size() != 2 * kept) {
    return response_not_found(id, " any more: session \"" + ref->session + "\" dropped that turn to stay within the context", param);
  }
  out->ref = *ref;
  out->at = 2 * static_cast<size_t>(ref->turn + kept - s->turns - 1);
  out->session = std::move(s.value());
  return {};
}

// The instructions of a session's bot when they are the instructions of a response (nullopt: a bot of
// the hierarchy, whose tower is the system prompt).
std::optional<std::string> session_instructions(Service& svc, const std::string& bot) {
  if (!is_instructions_bot(bot)) return std::nullopt;
  auto seg = svc.catalog.segment(bot);
  return seg.ok() ? std::optional<std::string>(seg->text) : std::nullopt;
}

// A continued session keeps its system prompt: the request may repeat it (as clients that resend
// their instructions do) or leave it out, not change it, and may not name another bot.
ApiStatus same_system(Service& svc, const ResponsesRequest& r, const SessionView& s) {
  if (!r.bot.empty() && r.bot != s.bot) {
    return invalid_field("bot", "the session of \"previous_response_id\" is under bot \"" + s.bot + "\", not \"" + r.bot + "\"");
  }
  if (r.input.system && session_instructions(svc, s.bot) != r.input.system) {
    return invalid_field("instructions", "\"instructions\" (with system and developer messages) differ from those the session of "
                                         "\"previous_response_id\" started with: a session's system prompt is fixed when it starts; "
                                         "send the same instructions or none");
  }
  return {};
}

// run_generation for a response: a prompt past the context is the input's fault (run_generation names
// the chat and completions fields).
ApiStatus run_response(Service& svc, HttpResponder& out, GenerationSpec spec) {
  spec.api = ReplyApi::Responses;
  ApiStatus e = run_generation(svc, out, std::move(spec));
  if (e.code == "context_length_exceeded") e.param = "input";
  return e;
}

// The response's session turn: the user's message prefilled after the session's transcript, the reply
// answered as a response. expect_turn: the turn number the response id was promised (a continuation
// whose previous response is no longer the latest is refused).
ApiStatus run_turn(Service& svc, HttpResponder& out, const std::string& session, const std::string& bot, ResponsesRequest r,
                   uint64_t expect_turn, const std::string& session_param) {
  GenerationSpec spec;
  std::vector<ToolChatMessage> messages;
  for (size_t i = 0; i < r.input.messages.size(); ++i) {
    messages.push_back({r.input.messages[i].role, r.input.messages[i].content, r.input.calls[i], r.input.call_ids[i]});
  }
  if (ApiStatus e = session_generation(svc, session, messages, r.tools, session_param, &r.params, &spec); !e.ok()) {
    if (e.code == "context_length_exceeded" || e.param == "messages") e.param = "input";
    return as_responses_error(e);
  }
  if (spec.session_turn()->number != expect_turn) {
    svc.catalog.abort_turn(session);
    return ApiStatus(Status::Conflict("\"previous_response_id\" is no longer the latest response of session \"" + session +
                                      "\" (another turn was added)"),
                     "previous_response_id");
  }
  // A first response creates its session: when the turn is not recorded, the empty session goes too.
  spec.remove_session_if_empty = expect_turn == 1;
  r.base["id"] = response_id(session, spec.session_turn()->number);
  r.base["session"] = session;
  r.base["bot"] = bot;
  if (!r.input.system) r.base["instructions"] = instructions_json(session_instructions(svc, bot));
  spec.params = std::move(r.params);
  spec.extra = std::move(r.base);
  return run_response(svc, out, std::move(spec));
}

// The bot a first response without "bot" runs under: its instructions' own (kResponsesPlatform and
// instructions_bot), defined the first time they are used. Offload thread (definitions are fsynced).
Result<std::string> ensure_instructions_bot(Service& svc, const std::string& instructions) {
  const std::string bot = instructions_bot(instructions);
  if (svc.catalog.segment(bot).ok()) return bot;
  const std::string platform(kResponsesPlatform);
  if (!svc.catalog.segment(platform).ok()) {
    if (auto put = svc.catalog.put_segment(platform, Level::Platform, "", ""); !put.ok()) return put.status();
  }
  if (auto put = svc.catalog.put_segment(bot, Level::Bot, platform, instructions); !put.ok()) return put.status();
  return bot;
}

// A first response: a new session (its record fsynced, so on the offload thread), then its first turn.
ApiStatus first_response(Service& svc, HttpResponder& out, ResponsesRequest r) {
  if (!r.bot.empty() && r.input.system) {
    return invalid_field("instructions", "a bot's tower is the session's system prompt: send \"instructions\" (or system "
                                         "messages) without \"bot\", or \"bot\" without them");
  }
  return answer_offloaded(svc, out, [&svc, r](HttpResponder& o) -> ApiStatus {
    std::string bot = r.bot;
    if (bot.empty()) {
      auto made = ensure_instructions_bot(svc, r.input.system.value_or(""));
      if (!made.ok()) return ApiStatus(made.status(), "instructions");
      bot = made.value();
    }
    auto created = svc.catalog.create_session(bot, "");
    if (!created.ok()) {
      if (created.status().code() == Status::Code::kResourceExhausted) return ApiStatus(created.status(), "", "session_limit_reached");
      return not_found_as(created.status(), "segment_not_found", "bot");
    }
    ApiStatus e = run_turn(svc, o, created->id, bot, r, 1, "");
    if (!e.ok()) (void)svc.catalog.delete_session(created->id);  // nothing of a response that never ran is kept
    return e;
  });
}

// "store": false: nothing is kept. The conversation (the previous response's session history, when
// given, then the input, which may hold a whole conversation) runs on the session-less path, and the
// response's id names no session.
ApiStatus unstored_response(Service& svc, HttpResponder& out, ResponsesRequest r) {
  const bool outputs = std::any_of(r.input.messages.begin(), r.input.messages.end(), [](const ChatMessage& m) { return m.role == "tool"; }) ||
                       std::any_of(r.input.calls.begin(), r.input.calls.end(), [](const auto& c) { return !c.empty(); });
  if (!r.tools.tools.empty() || outputs) {
    return unsupported(outputs ? "input" : "tools",
                       "tools, function_call and function_call_output items need a stored response (a session turn, which keeps the calls): "
                       "send \"store\": true, or the conversation to /v1/chat/completions");
  }
  std::vector<ChatMessage> chat;
  std::string bot = r.bot;
  if (!r.previous.empty()) {
    Located at;
    if (ApiStatus e = locate_response(svc, r.previous, "previous_response_id", &at); !e.ok()) return e;
    if (ApiStatus e = same_system(svc, r, at.session); !e.ok()) return e;
    bot = at.session.bot;
    const auto& kept = *at.session.transcript;
    chat.assign(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(at.at + 2));  // up to that response
    r.base["instructions"] = instructions_json(session_instructions(svc, bot));
  } else if (r.input.system) {
    if (!bot.empty()) return invalid_field("instructions", "a bot's tower is the system prompt: send \"instructions\" without \"bot\"");
    chat.push_back({"system", *r.input.system});
  }
  for (auto& m : r.input.messages) chat.push_back(std::move(m));
  auto begun = svc.catalog.begin_stateless(bot, std::move(chat));
  if (!begun.ok()) {
    if (begun.status().code() == Status::Code::kInvalidArgument) return ApiStatus(begun.status(), "input");
    return not_found_as(begun.status(), "segment_not_found", "bot");
  }
  GenerationSpec spec = stateless_spec(std::move(begun.value()));
  r.base["id"] = random_hex_id("resp_");
  if (!bot.empty()) r.base["bot"] = bot;
  spec.params = std::move(r.params);
  spec.extra = std::move(r.base);
  return run_response(svc, out, std::move(spec));
}

// A referenced function call (fc_<session>_<turn>_<k>): its call id, name and arguments from the
// session's reply.
ApiStatus resolve_call_reference(Service& svc, ToolCall* call) {
  const std::string id = call->id, call_id = "call_" + id.substr(3);
  auto ref = parse_call_id(call_id);
  Located at;
  ApiStatus e = locate_response(svc, response_id(ref->session, ref->turn), "input", &at);
  if (!e.ok()) return ApiStatus(Status::NotFound("item_reference \"" + id + "\": " + e.status.message()), "input", "response_not_found");
  auto parsed = at.session.tool_format
                    ? parse_tool_reply(*at.session.tool_format, (*at.session.transcript)[at.at + 1].content, /*as_streamed=*/true)
                    : Result<ParsedReply>(Status::InvalidArgument("no tools"));
  const std::string_view digits = std::string_view(id).substr(id.rfind('_') + 1);
  uint64_t k = UINT64_MAX;  // parse_call_id checked the digits; too many of them is no call either
  std::from_chars(digits.data(), digits.data() + digits.size(), k);
  if (!parsed.ok() || k >= parsed.value().tool_calls.size()) {
    return ApiStatus(Status::NotFound("item_reference \"" + id + "\": response \"" + response_id(ref->session, ref->turn) +
                                      "\" has no such function call"),
                     "input", "response_not_found");
  }
  *call = {call_id, parsed.value().tool_calls[k].name, parsed.value().tool_calls[k].arguments};
  return {};
}

// Item references: each referenced message gets its text from the session turn the id names, each
// referenced function call its name and arguments.
ApiStatus resolve_references(Service& svc, ResponseInput* input) {
  for (auto& calls : input->calls) {
    for (auto& call : calls) {
      if (!call.id.starts_with("fc_")) continue;
      if (ApiStatus e = resolve_call_reference(svc, &call); !e.ok()) return e;
    }
  }
  for (size_t i = 0; i < input->messages.size(); ++i) {
    const std::string& id = input->references[i];
    if (id.empty()) continue;
    Located at;
    if (ApiStatus e = locate_response(svc, "resp_" + id.substr(4), "input", &at); !e.ok()) {
      return ApiStatus(Status::NotFound("item_reference \"" + id + "\": " + e.status.message()), "input", "response_not_found");
    }
    // As transcript_json reads a reply: with tools, the text before its calls.
    const std::string& reply = (*at.session.transcript)[at.at + 1].content;
    auto parsed = at.session.tool_format ? parse_tool_reply(*at.session.tool_format, reply, /*as_streamed=*/true)
                                         : Result<ParsedReply>(Status::InvalidArgument(""));
    input->messages[i].content = parsed.ok() ? parsed.value().content : reply;
  }
  return {};
}

// A stored response whose input is a whole conversation (what the AI SDK sends when responses are
// stored): its last earlier message is a session's reply, named by an item_reference or by the
// call_ids of its function_call items, and the response continues that session as
// previous_response_id would; session_generation checks that the conversation before is the
// session's. A conversation that names no reply is left as it is (and refused by the caller).
ApiStatus continue_conversation(ResponsesRequest* r) {
  const auto& input = r->input;
  const size_t n = input.messages.size(), fresh = new_turn_messages(input.messages);
  if (fresh == 0 || fresh == n) return {};
  const size_t last = n - fresh - 1;
  std::optional<ResponseRef> ref;
  if (!input.references[last].empty()) {
    ref = parse_item_id(input.references[last]);
  } else if (!input.calls[last].empty()) {
    ref = parse_call_id(input.calls[last].front().id);
    if (!ref) {
      return invalid_field("input", "function_call \"" + input.calls[last].front().id + "\" is not a call of one of towerd's "
                                    "responses (call_<session>_<turn>_<k>): a stored response continues the session of the "
                                    "reply before its new input");
    }
  }
  if (!ref) return {};
  r->previous = response_id(ref->session, ref->turn);
  r->base["previous_response_id"] = r->previous;
  r->whole_conversation = true;
  return {};
}

}  // namespace

ApiStatus handle_responses(Service& svc, const HttpRequest& req, HttpResponder& out, const std::string&) {
  ResponsesRequest r;
  if (ApiStatus e = parse_responses_request(svc, req, &r); !e.ok()) return e;
  if (ApiStatus e = resolve_references(svc, &r.input); !e.ok()) return e;
  if (!r.store) return unstored_response(svc, out, std::move(r));
  if (r.previous.empty()) {
    if (ApiStatus e = continue_conversation(&r); !e.ok()) return e;
  }
  const size_t fresh = new_turn_messages(r.input.messages), history = r.input.messages.size() - fresh;
  const bool outputs = !r.previous.empty() && r.input.messages.back().role == "tool";
  if (!(outputs || (fresh == 1 && r.input.messages.back().role == "user")) || (history > 0 && !r.whole_conversation)) {
    return invalid_field("input", "a stored response is the next turn of a towerd session, so \"input\" holds exactly one user "
                                  "message, or with \"previous_response_id\" the function_call_output items answering its "
                                  "function calls (got " + std::to_string(r.input.messages.size()) + " messages): the "
                                  "session keeps the history; continue with \"previous_response_id\" (or send the whole "
                                  "conversation, the session's last reply as an item_reference or its function_call items, "
                                  "then the new input), or send "
                                  "\"store\": false with a whole conversation");
  }
  if (r.previous.empty()) return first_response(svc, out, std::move(r));
  Located at;
  if (ApiStatus e = locate_response(svc, r.previous, "previous_response_id", &at); !e.ok()) return e;
  if (at.ref.turn != at.session.turns) {
    return invalid_field("previous_response_id", "\"" + r.previous + "\" is not the latest response of its session (that is \"" +
                                                     response_id(at.ref.session, at.session.turns) + "\"): a stored response "
                                                     "continues its session, which towerd does not branch (\"store\": false may)");
  }
  if (ApiStatus e = same_system(svc, r, at.session); !e.ok()) return e;
  const std::string bot = at.session.bot;
  return run_turn(svc, out, at.ref.session, bot, std::move(r), at.ref.turn + 1, "previous_response_id");
}

ApiStatus handle_response(Service& svc, const HttpRequest& req, HttpResponder& out, const std::string& id) {
  Located at;
  if (ApiStatus e = locate_response(svc, id, "", &at); !e.ok()) return e;
  if (req.method == "DELETE") {
    // A response is a turn of its session, which cannot lose one turn in the middle: the whole session goes.
    return answer_offloaded(svc, out, [&svc, id, session = at.ref.session](HttpResponder& o) -> ApiStatus {
      Status st = svc.catalog.delete_session(session);
      if (!st.ok()) return not_found_as(st, "response_not_found");
      return reply(o, {{"id", id}, {"object", "response"}, {"deleted", true}, {"session", session}});
    });
  }
  const auto& messages = *at.session.transcript;
  json base = {{"id", id},
               {"created_at", at.session.updated},
               {"model", svc.model_id},
               {"instructions", instructions_json(session_instructions(svc, at.session.bot))},
               {"previous_response_id", at.ref.turn > 1 ? json(response_id(at.ref.session, at.ref.turn - 1)) : json(nullptr)},
               {"store", true},
               {"tools", responses_tools_json(at.session.tools)},
               {"text", {{"format", {{"type", "text"}}}}},
               {"session", at.ref.session},
               {"bot", at.session.bot}};
  return reply(out, response_object(base, "completed",
                                    response_output(id, "completed", messages[at.at + 1].content, at.session.tool_format), nullptr));
}

}  // namespace towers::daemon::api
