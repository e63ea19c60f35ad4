#include "engine/constrained/tool_format.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/constrained/grammar.h"
#include "engine/constrained/json_schema.h"

namespace towers {

namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Python's json.dumps(x, ensure_ascii=False, indent=indent) as Hugging Face's tojson filter calls it:
// ", " and ": " without indent; "," + newline and ": " with it.
void py_json(const Json& j, int indent, int level, std::string& out) {
  const std::string pad = indent > 0 ? "\n" + std::string(size_t(indent) * size_t(level + 1), ' ') : "";
  const std::string close_pad = indent > 0 ? "\n" + std::string(size_t(indent) * size_t(level), ' ') : "";
  const char* sep = indent > 0 ? "," : ", ";
  if (j.is_object()) {
    if (j.empty()) {
      out += "{}";
      return;
    }
    out += '{';
    bool first = true;
    for (const auto& [k, v] : j.items()) {
      if (!first) out += sep;
      first = false;
      out += pad + Json(k).dump() + ": ";
      py_json(v, indent, level + 1, out);
    }
    out += close_pad + "}";
  } else if (j.is_array()) {
    if (j.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) out += sep;
      out += pad;
      py_json(j[i], indent, level + 1, out);
    }
    out += close_pad + "]";
  } else {
    out += j.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
}
std::string py_json(const Json& j, int indent = 0) {
  std::string out;
  py_json(j, indent, 0, out);
  return out;
}

bool valid_tool_name(std::string_view n) {
  if (n.empty() || n.size() > 64) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

Status check_tools(std::span<const ToolDefinition> tools) {
  std::set<std::string_view> seen;
  for (const auto& t : tools) {
    if (!valid_tool_name(t.name))
      return Status::InvalidArgument("tool name '" + t.name + "' must be 1 to 64 of a-z, A-Z, 0-9, '_', '-'");
    if (!seen.insert(t.name).second) return Status::InvalidArgument("tool '" + t.name + "' is defined twice");
    if (!t.parameters.empty() && Json::parse(t.parameters, nullptr, false).is_discarded())
      return Status::InvalidArgument("tool '" + t.name + "': parameters is not valid JSON");
  }
  return Status::Ok();
}

// The OpenAI tool object the templates print.
Json tool_json(const ToolDefinition& t) {
  Json f = Json::object();
  f["name"] = t.name;
  if (!t.description.empty()) f["description"] = t.description;
  if (!t.parameters.empty()) f["parameters"] = Json::parse(t.parameters);
  return Json{{"type", "function"}, {"function", f}};
}

Result<Json> call_arguments(const ToolCall& c) {
  if (c.arguments.empty()) return Json::object();
  Json a = Json::parse(c.arguments, nullptr, false);
  if (a.is_discarded()) return Status::InvalidArgument("tool call '" + c.name + "': arguments are not valid JSON");
  return a;
}

const char* const kLlama3ToolsPrompt =
    "Given the following functions, please respond with a JSON for a function call with its proper arguments "
    "that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
    "dictionary of argument name and its value}.Do not use variables.\n\n";

const char* const kHermesToolsHead =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>";
const char* const kHermesToolsTail =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>";

std::string llama3_tools_text(std::span<const ToolDefinition> tools) {
  std::string text = kLlama3ToolsPrompt;
  for (const auto& t : tools) text += py_json(tool_json(t), 4) + "\n\n";
  return text;
}

std::string hermes_tools_text(std::span<const ToolDefinition> tools) {
  std::string section = kHermesToolsHead;
  for (const auto& t : tools) section += "\n" + py_json(tool_json(t));
  return section + kHermesToolsTail;
}

// The system text (the first message's, else the template's default) and whether the conversation
// has one; `next` moves past it.
std::pair<std::string, bool> leading_system(std::span<const ToolChatMessage> messages,
                                            std::string_view default_system, size_t& next) {
  if (!messages.empty() && messages[0].role == "system") {
    next = 1;
    return {messages[0].content, true};
  }
  return {std::string(default_system), false};
}

Result<std::vector<ChatMessage>> render_llama3(std::span<const ToolChatMessage> messages,
                                              std::span<const ToolDefinition> tools, bool tools_on,
                                              std::string_view default_system) {
  std::vector<ChatMessage> out;
  size_t i = 0;
  const auto [system, has_system] = leading_system(messages, default_system, i);
  if (tools_on) out.push_back({"system", "Environment: ipython\n\n" + system});
  else if (has_system || !system.empty()) out.push_back({"system", system});
  if (tools_on) {
    if (i >= messages.size() || messages[i].role != "user")
      return Status::InvalidArgument("the llama3 tool format puts the tools in the first user message, and there is none");
    out.push_back({"user", llama3_tools_text(tools) + messages[i++].content});
  }
  for (; i < messages.size(); ++i) {
    const ToolChatMessage& m = messages[i];
    if (m.role == "tool") {
      out.push_back({"ipython", py_json(Json(m.content))});
    } else if (!m.tool_calls.empty()) {
      if (m.tool_calls.size() > 1)
        return Status::InvalidArgument("the llama3 tool format has one tool call per message (message " +
                                       std::to_string(i) + " has " + std::to_string(m.tool_calls.size()) + ")");
      const ToolCall& c = m.tool_calls[0];
      auto args = call_arguments(c);
      if (!args.ok()) return args.status();
      out.push_back({"assistant", "{\"name\": \"" + c.name + "\", \"parameters\": " + py_json(*args) + "}"});
    } else {
      out.push_back({m.role, m.content});
    }
  }
  return out;
}

Result<std::vector<ChatMessage>> render_hermes(std::span<const ToolChatMessage> messages,
                                              std::span<const ToolDefinition> tools, bool tools_on,
                                              std::string_view default_system) {
  std::vector<ChatMessage> out;
  size_t i = 0;
  const auto [system, has_system] = leading_system(messages, default_system, i);
  if (tools_on) {
    const std::string section = hermes_tools_text(tools);
    out.push_back({"system", system.empty() ? section : system + "\n\n" + section});
  } else if (has_system || !system.empty()) {
    out.push_back({"system", system});
  }
  for (; i < messages.size(); ++i) {
    const ToolChatMessage& m = messages[i];
    if (m.role == "tool") {
      std::string block = "<tool_response>\n" + m.content + "\n</tool_response>";
      if (i > 0 && messages[i - 1].role == "tool" && !out.empty()) out.back().content += "\n" + block;
      else out.push_back({"user", block});
    } else if (!m.tool_calls.empty()) {
      std::string content = m.content.empty() ? "" : m.content + "\n";
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        auto args = call_arguments(m.tool_calls[k]);
        if (!args.ok()) return args.status();
        content += (k ? "\n" : "") + std::string("<tool_call>\n{\"name\": \"") + m.tool_calls[k].name +
                   "\", \"arguments\": " + py_json(*args) + "}\n</tool_call>";
      }
      out.push_back({"assistant", content});
    } else {
      out.push_back({m.role, m.content});
    }
  }
  return out;
}

// GBNF rules for any text that does not contain `s` (ASCII): the states of its Knuth-Morris-Pratt
// matcher, one rule each, every one of which may end. Returns the start rule.
Result<std::string> text_without(JsonGrammarBuilder& b, std::string_view s) {
  const size_t m = s.size();
  std::vector<size_t> fail(m, 0);
  for (size_t i = 1, k = 0; i < m; ++i) {
    while (k > 0 && s[i] != s[k]) k = fail[k - 1];
    if (s[i] == s[k]) ++k;
    fail[i] = k;
  }
  auto step = [&](size_t state, char c) {
    while (state > 0 && s[state] != c) state = fail[state - 1];
    return s[state] == c ? state + 1 : 0;
  };
  std::string chars;
  for (char c : s)
    if (chars.find(c) == std::string::npos) chars += c;
  std::string others = "[^";
  char buf[8];
  for (char c : chars) {
    std::snprintf(buf, sizeof buf, "\\x%02X", unsigned(uint8_t(c)));
    others += buf;
  }
  others += "]";
  auto name = [](size_t state) { return "free-text-" + std::to_string(state); };
  for (size_t state = 0; state < m; ++state) {
    std::string body = "\"\" | " + others + " " + name(0);
    for (char c : chars) {
      const size_t next = step(state, c);
      if (next == m) continue;  // would complete s
      auto lit = gbnf_literal(std::string(1, c));
      if (!lit.ok()) return lit.status();
      body += " | " + *lit + " " + name(next);
    }
    if (b.add_rule(name(state), body) != name(state))
      return Status::Error("tool grammar: rule name " + name(state) + " taken");
  }
  return name(0);
}

}  // namespace

ToolFormat tool_format_for(ChatFamily family) {
  return family == ChatFamily::Llama3 ? ToolFormat::Llama3Json : ToolFormat::Hermes;
}

std::string_view tool_format_name(ToolFormat format) {
  return format == ToolFormat::Llama3Json ? "llama3-json" : "hermes";
}

Result<std::vector<ChatMessage>> render_tool_messages(ChatFamily family, std::span<const ToolChatMessage> messages,
                                                      std::span<const ToolDefinition> tools,
                                                      const ToolChoice& choice, std::string_view default_system) {
  if (Status s = check_tools(tools); !s.ok()) return s;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool")
      return Status::InvalidArgument("message " + std::to_string(i) + " has unknown role '" + m.role +
                                     "' (known: system, user, assistant, tool)");
    if (!m.tool_calls.empty() && m.role != "assistant")
      return Status::InvalidArgument("message " + std::to_string(i) + ": only assistant messages carry tool_calls");
    for (const auto& c : m.tool_calls) {
      if (!valid_tool_name(c.name))
        return Status::InvalidArgument("message " + std::to_string(i) + ": tool call name '" + c.name + "' is not valid");
    }
  }
  const bool tools_on = !tools.empty() && choice.mode != ToolChoice::Mode::None;
  if (tool_format_for(family) == ToolFormat::Llama3Json) return render_llama3(messages, tools, tools_on, default_system);
  return render_hermes(messages, tools, tools_on, default_system);
}

Result<ToolsBlock> tools_block(ToolFormat format, std::span<const ToolDefinition> tools) {
  if (Status s = check_tools(tools); !s.ok()) return s;
  if (tools.empty()) return Status::InvalidArgument("no tools");
  if (format == ToolFormat::Llama3Json) return ToolsBlock{ToolsBlock::Place::FirstUserStart, llama3_tools_text(tools)};
  return ToolsBlock{ToolsBlock::Place::SystemEnd, hermes_tools_text(tools)};
}

std::string tools_json(std::span<const ToolDefinition> tools) {
  Json out = Json::array();
  for (const auto& t : tools) out.push_back(tool_json(t)["function"]);
  return out.dump();
}

Result<std::vector<ToolDefinition>> parse_tools_json(std::string_view text) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return Status::InvalidArgument("tools JSON is not an array");
  std::vector<ToolDefinition> tools;
  for (const auto& f : j) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string())
      return Status::InvalidArgument("tools JSON: an entry without a name");
    ToolDefinition t;
    t.name = f["name"].get<std::string>();
    if (f.contains("description") && f["description"].is_string()) t.description = f["description"].get<std::string>();
    if (f.contains("parameters")) t.parameters = f["parameters"].dump();
    tools.push_back(std::move(t));
  }
  if (Status s = check_tools(tools); !s.ok()) return s;
  return tools;
}

std::string tool_results_json(std::span<const ToolChatMessage> results) {
  Json out = Json::array();
  for (const auto& m : results) out.push_back({{"tool_call_id", m.tool_call_id}, {"content", m.content}});
  return out.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Result<std::vector<ToolChatMessage>> parse_tool_results_json(std::string_view text) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array() || j.empty()) return Status::InvalidArgument("tool results JSON is not a non-empty array");
  std::vector<ToolChatMessage> out;
  for (const auto& r : j) {
    if (!r.is_object() || !r.contains("content") || !r["content"].is_string())
      return Status::InvalidArgument("tool results JSON: an entry without a string content");
    ToolChatMessage m;
    m.role = "tool";
    m.content = r["content"].get<std::string>();
    if (r.contains("tool_call_id") && r["tool_call_id"].is_string()) m.tool_call_id = r["tool_call_id"].get<std::string>();
    out.push_back(std::move(m));
  }
  return out;
}

Result<std::string> tool_call_gbnf(ToolFormat format, std::span<const ToolDefinition> tools, const ToolChoice& choice,
                                   int max_calls) {
  if (choice.mode == ToolChoice::Mode::None || tools.empty()) return std::string();
  if (Status s = check_tools(tools); !s.ok()) return s;
  const bool named = choice.mode == ToolChoice::Mode::Named;
  if (named && std::none_of(tools.begin(), tools.end(), [&](const ToolDefinition& t) { return t.name == choice.name; }))
    return Status::InvalidArgument("tool_choice names '" + choice.name + "', which is not among the tools");
  if (format == ToolFormat::Llama3Json || named) max_calls = 1;
  if (max_calls < 1) return Status::InvalidArgument("max_calls must be at least 1");

  JsonGrammarBuilder b;
  const std::string ws = b.ws();
  const std::string args_key = format == ToolFormat::Llama3Json ? "\"\\\"parameters\\\"\"" : "\"\\\"arguments\\\"\"";
  std::string calls;
  for (const auto& t : tools) {
    if (named && t.name != choice.name) continue;
    auto args = b.add_schema(t.parameters.empty() ? R"({"type": "object"})" : t.parameters, "args-" + t.name);
    if (!args.ok()) return args.status().prefixed("tool '" + t.name + "': ");
    const std::string body = "\"{\" " + ws + " \"\\\"name\\\"\" " + ws + " \":\" " + ws + " \"\\\"" + t.name +
                             "\\\"\" " + ws + " \",\" " + ws + " " + args_key + " " + ws + " \":\" " + ws + " " +
                             *args + " " + ws + " \"}\"";
    calls += (calls.empty() ? "" : " | ") + b.add_rule("call-" + t.name, body);
  }
  const std::string call = b.add_rule("call", calls);
  if (format == ToolFormat::Llama3Json) {
    if (choice.mode != ToolChoice::Mode::Auto) return b.gbnf(call);
    // Text that cannot be taken for a call: empty, or starting with neither "{" nor whitespace.
    const std::string text = b.add_rule("text", "( [^{ \\t\\n\\r] .* )?");
    return b.gbnf(call + " | " + text);
  }
  const std::string tagged = b.add_rule("tagged-call", "\"<tool_call>\" " + ws + " " + call + " " + ws + " \"</tool_call>\"");
  // After a call: the end of the turn, or one "\n" (the template's separator) and then the end or the
  // next call. Whitespace never commits the model to another call (a model that likes line breaks
  // would otherwise be walked into call after call up to max_tokens), and after the max_calls-th
  // call only the end is left.
  std::string list = b.add_rule("calls-1", tagged);
  for (int k = 2; k <= max_calls; ++k)
    list = b.add_rule("calls-" + std::to_string(k), tagged + " ( \"\\n\" " + list + "? )?");
  if (choice.mode != ToolChoice::Mode::Auto) return b.gbnf(list);
  auto free = text_without(b, kCallOpen);
  if (!free.ok()) return free.status();
  return b.gbnf(*free + " " + list + "?");
}

// ------------------------------------------------------------------------------------------- parsing

struct ToolCallParser::Impl {
  ToolFormat format;
  bool active;
  enum class Mode { Start, Content, BeforeObject, Object, AfterObject, Trailing } mode = Mode::Start;
  std::string held;  // content (or a closing tag) not yet certain
  std::vector<Event> events;
  Status error;
  int index = -1;

  // The call object being read: its text, and the scanner's position in its top level.
  enum class Top { Key, InKey, Colon, Value, InValue, AfterValue } top = Top::Key;
  std::string obj;
  std::string key;
  size_t key_start = 0, value_start = 0;
  int depth = 0;          // nesting inside the current value
  bool in_string = false, escape = false;
  bool value_is_scalar = false;
  std::string name, args;
  bool have_args = false, started = false, streaming_args = false;

  Impl(ToolFormat f, bool a) : format(f), active(a) {}

  void emit(Event::Kind kind, std::string_view text) {
    if (text.empty() && kind != Event::Kind::CallStart) return;
    if (kind != Event::Kind::CallStart && !events.empty() && events.back().kind == kind && events.back().index == index) {
      events.back().text += text;
      return;
    }
    events.push_back({kind, kind == Event::Kind::Content ? 0 : index, std::string(text)});
  }

  void fail(const std::string& what) {
    if (error.ok()) error = Status::InvalidArgument("tool call " + std::to_string(index) + ": " + what);
    mode = Mode::Trailing;
  }

  bool is_args_key() const { return key == "arguments" || key == "parameters"; }

  void start_call() {
    ++index;
    mode = Mode::BeforeObject;
    top = Top::Key;
    obj.clear();
    name.clear();
    args.clear();
    have_args = started = streaming_args = false;
    depth = 0;
    in_string = escape = false;
  }

  // The end of a top-level value obj[value_start, end).
  void value_done(size_t end) {
    const std::string text = obj.substr(value_start, end - value_start);
    if (key == "name") {
      Json n = Json::parse(text, nullptr, false);
      if (!n.is_string()) return fail("name is not a string");
      name = n.get<std::string>();
      if (!started) {
        started = true;
        emit(Event::Kind::CallStart, name);
        if (have_args) emit(Event::Kind::Arguments, args);  // they came first
      }
    } else if (is_args_key()) {
      args = text;
      have_args = true;
      streaming_args = false;
    }
    top = Top::AfterValue;
  }

  void object_done() {
    if (name.empty() || !have_args) return fail("needs a \"name\" and \"arguments\" (or \"parameters\")");
    if (Json::parse(args, nullptr, false).is_discarded()) return fail("arguments are not valid JSON");
    mode = format == ToolFormat::Hermes ? Mode::AfterObject : Mode::Trailing;
  }

  // One byte of the call object (after its '{').
  void object_byte(char c) {
    obj += c;
    const size_t pos = obj.size() - 1;
    switch (top) {
      case Top::Key:
        if (is_space(c) || c == ',') return;
        if (c == '}') return object_done();
        if (c != '"') return fail("expected a key");
        key_start = pos;
        top = Top::InKey;
        in_string = true;
        escape = false;
        return;
      case Top::InKey:
        if (escape) escape = false;
        else if (c == '\\') escape = true;
        else if (c == '"') {
          Json k = Json::parse(obj.substr(key_start, pos + 1 - key_start), nullptr, false);
          key = k.is_string() ? k.get<std::string>() : "";
          top = Top::Colon;
        }
        return;
      case Top::Colon:
        if (is_space(c)) return;
        if (c != ':') return fail("expected ':'");
        top = Top::Value;
        return;
      case Top::Value:
        if (is_space(c)) return;
        value_start = pos;
        top = Top::InValue;
        depth = 0;
        in_string = false;
        escape = false;
        value_is_scalar = c != '{' && c != '[' && c != '"';
        streaming_args = is_args_key() && started;
        [[fallthrough]];
      case Top::InValue:
        if (value_is_scalar) {
          if (c == ',' || c == '}' || is_space(c)) {
            value_done(pos);
            return object_byte_after_value(c);
          }
          if (streaming_args) emit(Event::Kind::Arguments, std::string_view(&obj[pos], 1));
          return;
        }
        if (streaming_args) emit(Event::Kind::Arguments, std::string_view(&obj[pos], 1));
        if (in_string) {
          if (escape) escape = false;
          else if (c == '\\') escape = true;
          else if (c == '"') {
            in_string = false;
            if (depth == 0) value_done(pos + 1);
          }
          return;
        }
        if (c == '"') {
          in_string = true;
        } else if (c == '{' || c == '[') {
          ++depth;
        } else if (c == '}' || c == ']') {
          if (--depth == 0) value_done(pos + 1);
        }
        return;
      case Top::AfterValue:
        return object_byte_after_value(c);
    }
  }
  void object_byte_after_value(char c) {
    if (is_space(c)) return;
    if (c == ',') {
      top = Top::Key;
      return;
    }
    if (c == '}') return object_done();
    fail("expected ',' or '}' after a value");
  }

  // Content text, holding back whitespace and what could be the start of "<tool_call>".
  void content(bool final) {
    if (format == ToolFormat::Hermes && active) {
      const size_t at = held.find(kCallOpen);
      if (at != std::string::npos) {
        size_t end = at;
        while (end > 0 && is_space(held[end - 1])) --end;
        emit(Event::Kind::Content, std::string_view(held).substr(0, end));
        const std::string rest = held.substr(at + kCallOpen.size());
        held.clear();
        start_call();
        return run(rest);
      }
    }
    if (final) {
      emit(Event::Kind::Content, held);
      held.clear();
      return;
    }
    size_t keep = 0;
    if (format == ToolFormat::Hermes && active) {
      for (size_t n = std::min(held.size(), kCallOpen.size() - 1); n > 0; --n) {
        if (kCallOpen.substr(0, n) == std::string_view(held).substr(held.size() - n)) {
          keep = n;
          break;
        }
      }
      while (keep < held.size() && is_space(held[held.size() - keep - 1])) ++keep;
    }
    emit(Event::Kind::Content, std::string_view(held).substr(0, held.size() - keep));
    held.erase(0, held.size() - keep);
  }

  void run(std::string_view text) {
    for (size_t i = 0; i < text.size(); ++i) {
      const char c = text[i];
      switch (mode) {
        case Mode::Start:
          if (active && format == ToolFormat::Llama3Json && c == '{') {
            start_call();
            mode = Mode::Object;
            continue;
          }
          mode = Mode::Content;
          [[fallthrough]];
        case Mode::Content:
          held.append(text.substr(i));
          return content(false);
        case Mode::BeforeObject:
          if (is_space(c)) continue;
          if (c != '{') {
            fail("expected '{' after <tool_call>");
            continue;
          }
          mode = Mode::Object;
          continue;
        case Mode::Object:
          object_byte(c);
          continue;
        case Mode::AfterObject:  // whitespace, then </tool_call>
          if (held.empty() && is_space(c)) continue;
          held += c;
          if (std::string_view(kCallClose).substr(0, held.size()) != held) {
            fail("expected </tool_call>");
            continue;
          }
          if (held.size() == kCallClose.size()) {
            held.clear();
            mode = Mode::Content;
          }
          continue;
        case Mode::Trailing:
          if (!is_space(c) && error.ok()) fail("text after the tool call");
          continue;
      }
    }
  }
};

ToolCallParser::ToolCallParser(ToolFormat format, bool tools_active)
    : impl_(std::make_unique<Impl>(format, tools_active)) {}
ToolCallParser::~ToolCallParser() = default;
ToolCallParser::ToolCallParser(ToolCallParser&&) noexcept = default;
ToolCallParser& ToolCallParser::operator=(ToolCallParser&&) noexcept = default;

std::vector<ToolCallParser::Event> ToolCallParser::feed(std::string_view text) {
  impl_->run(text);
  return std::exchange(impl_->events, {});
}

Result<std::vector<ToolCallParser::Event>> ToolCallParser::finish() {
  using Mode = Impl::Mode;
  if (impl_->mode == Mode::Content || impl_->mode == Mode::Start) {
    // Whitespace after the last call is not content.
    if (impl_->index >= 0 && std::all_of(impl_->held.begin(), impl_->held.end(), is_space)) impl_->held.clear();
    impl_->content(true);
  }
  else if (impl_->mode == Mode::BeforeObject || impl_->mode == Mode::Object) impl_->fail("unfinished");
  else if (impl_->mode == Mode::AfterObject && !impl_->held.empty()) impl_->fail("unfinished </tool_call>");
  if (!impl_->error.ok()) return impl_->error;
  return std::exchange(impl_->events, {});
}

Result<ParsedReply> parse_tool_reply(ToolFormat format, std::string_view text, bool as_streamed) {
  ToolCallParser p(format, true);
  std::vector<ToolCallParser::Event> events = p.feed(text);
  auto tail = p.finish();
  if (!tail.ok() && !as_streamed) return tail.status();
  if (tail.ok()) events.insert(events.end(), tail->begin(), tail->end());
  ParsedReply r;
  for (const auto& e : events) {
    switch (e.kind) {
      case ToolCallParser::Event::Kind::Content: r.content += e.text; break;
      case ToolCallParser::Event::Kind::CallStart: r.tool_calls.push_back({"", e.text, ""}); break;
      case ToolCallParser::Event::Kind::Arguments: r.tool_calls[size_t(e.index)].arguments += e.text; break;
    }
  }
  return r;
}

}  // namespace towers
