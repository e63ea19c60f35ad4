#include "engine/constrained/json_schema.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/constrained/grammar.h"
#include "engine/constrained/json_schema_leaves.h"

namespace towers {

namespace {

using Json = nlohmann::ordered_json;

constexpr int kMaxSchemaDepth = 64;

const std::set<std::string, std::less<>> kAnnotations = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", "$defs", "definitions"};
const std::set<std::string, std::less<>> kKnown = {
    "type", "properties", "required", "additionalProperties", "propertyNames", "enum", "const", "items",
    "prefixItems", "additionalItems", "anyOf", "oneOf", "allOf", "$ref", "minLength", "maxLength", "pattern",
    "format", "minItems", "maxItems", "uniqueItems", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
const std::set<std::string, std::less<>> kObjectKeys = {"properties", "required", "additionalProperties",
                                                        "propertyNames"};
const std::set<std::string, std::less<>> kArrayKeys = {"items", "prefixItems", "additionalItems", "minItems",
                                                       "maxItems", "uniqueItems"};
const std::set<std::string, std::less<>> kStringKeys = {"minLength", "maxLength", "pattern", "format"};
const std::set<std::string, std::less<>> kNumberKeys = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
// In allOf, these keywords combine by taking the tighter value.
const std::set<std::string, std::less<>> kLowerBounds = {"minLength", "minItems", "minimum", "exclusiveMinimum"};
const std::set<std::string, std::less<>> kUpperBounds = {"maxLength", "maxItems", "maximum", "exclusiveMaximum"};
const char* const kTypes[] = {"object", "array", "string", "number", "integer", "boolean", "null"};

std::string sanitize(std::string_view hint) {
  std::string out;
  for (char c : hint) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (ok) out += c;
    else if (!out.empty() && out.back() != '-') out += '-';
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  if (out.empty() || !((out[0] >= 'a' && out[0] <= 'z') || (out[0] >= 'A' && out[0] <= 'Z'))) out = "s-" + out;
  return out;
}

// JSON pointer token unescaping (RFC 6901) plus the percent-encoding URI fragments may carry.
std::string unescape_pointer_token(std::string_view t) {
  std::string out;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '~' && i + 1 < t.size() && (t[i + 1] == '0' || t[i + 1] == '1')) {
      out += t[i + 1] == '0' ? '~' : '/';
      ++i;
    } else if (t[i] == '%' && i + 2 < t.size() && std::isxdigit(uint8_t(t[i + 1])) &&
               std::isxdigit(uint8_t(t[i + 2]))) {
      out += char(std::stoi(std::string(t.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += t[i];
    }
  }
  return out;
}

bool value_has_type(const Json& v, std::string_view type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer") {
    return v.is_number_integer() ||
           (v.is_number_float() && std::isfinite(v.get<double>()) && std::trunc(v.get<double>()) == v.get<double>());
  }
  if (type == "boolean") return v.is_boolean();
  return v.is_null();
}

// propertyNames that every key satisfies (zod writes {"type": "string"} for records).
bool is_any_string_schema(const Json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (!v.is_object()) return false;
  for (const auto& [k, x] : v.items()) {
    if (kAnnotations.count(k)) continue;
    if (k != "type" || x != "string") return false;
  }
  return true;
}

}  // namespace

struct JsonGrammarBuilder::Impl {
  std::vector<std::pair<std::string, std::string>> rules;  // name, body; in definition order
  std::set<std::string> names;
  std::set<std::string> caller_rules;  // add_rule's: they may name rules the caller defines later
  std::map<std::string, std::string> by_body;  // generated body → rule name (sharing equal rules)

  // The schema document being compiled (for $ref) and its compiled references.
  const Json* doc = nullptr;
  std::string doc_name;
  std::map<std::string, std::string> ref_rules;

  std::string unique_name(std::string_view hint) {
    std::string base = sanitize(hint), name = base;
    for (int k = 2; names.count(name); ++k) name = base + "-" + std::to_string(k);
    names.insert(name);
    return name;
  }
  std::string define(std::string_view hint, std::string body) {
    if (auto it = by_body.find(body); it != by_body.end()) return it->second;
    std::string name = unique_name(hint);
    by_body.emplace(body, name);
    rules.emplace_back(name, std::move(body));
    return name;
  }
  // A rule with a fixed name (the generic ones), defined once.
  std::string fixed(const std::string& name, const std::string& body) {
    if (!names.count(name)) {
      names.insert(name);
      rules.emplace_back(name, body);
    }
    return name;
  }

  std::string ws() { return fixed("ws", R"(( " " | "\n" [ \t]{0,20} )?)"); }
  std::string sep() { return ws() + " \",\" " + ws(); }
  std::string colon() { return ws() + " \":\" " + ws(); }
  std::string json_char() {
    fixed("json-hex4", "[0-9a-cA-C] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | [eEfF] [0-9a-fA-F]{3}");
    return fixed("json-char", R"([^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" json-hex4 ))");
  }
  std::string json_string() { return fixed("json-string", "\"\\\"\" " + json_char() + "* \"\\\"\""); }
  std::string json_int() { return fixed("json-int", R"("-"? ( "0" | [1-9] [0-9]{0,15} ))"); }
  std::string json_number() {
    return fixed("json-number", json_int() + R"( ( "." [0-9]{1,15} )? ( [eE] [-+]? [0-9]{1,2} )?)");
  }
  std::string json_value() {
    if (names.count("json-value")) return "json-value";
    names.insert("json-value");
    const size_t at = rules.size();
    rules.emplace_back("json-value", "");
    const std::string obj = json_object();
    const std::string arr = fixed("json-array", "\"[\" " + ws() + " ( json-value ( " + sep() + " json-value )* " +
                                                    ws() + " )? \"]\"");
    rules[at].second = obj + " | " + arr + " | " + json_string() + " | " + json_number() +
                       " | \"true\" | \"false\" | \"null\"";
    return "json-value";
  }
  std::string json_object() {
    if (names.count("json-object")) return "json-object";
    const std::string pair = json_string() + " " + colon() + " json-value";
    fixed("json-object", "\"{\" " + ws() + " ( " + pair + " ( " + sep() + " " + pair + " )* " + ws() + " )? \"}\"");
    json_value();
    return "json-object";
  }

  static Result<std::string> literal(const Json& v) {
    auto lit = gbnf_literal(v.dump(-1, ' ', false, Json::error_handler_t::strict));
    if (!lit.ok()) return lit.status();
    return *lit;
  }

  // ------------------------------------------------------------------------------------ schemas
  Status unsupported(const std::string& keyword, const std::string& path, const std::string& why = "") {
    return Status::InvalidArgument("JSON schema: unsupported keyword '" + keyword + "' at " + path +
                                   (why.empty() ? "" : " (" + why + ")"));
  }
  Status invalid(const std::string& path, const std::string& what) {
    return Status::InvalidArgument("JSON schema: " + what + " at " + path);
  }

  Result<size_t> count(const Json& s, const char* key, const std::string& path) {
    const Json& v = s[key];
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      return invalid(path, std::string(key) + " must be a non-negative integer");
    const uint64_t n = v.get<uint64_t>();
    if (n > uint64_t(Grammar::kMaxRepeat))
      return invalid(path, std::string(key) + " " + std::to_string(n) + " is above the limit " +
                               std::to_string(Grammar::kMaxRepeat));
    return size_t(n);
  }

  // A GBNF expression (a rule name or a parenthesised group) for values valid against `s`.
  Result<std::string> schema(const Json& s, const std::string& path, const std::string& hint, int depth) {
    if (depth > kMaxSchemaDepth) return invalid(path, "schema nested deeper than " + std::to_string(kMaxSchemaDepth));
    if (s.is_boolean()) {
      if (s.get<bool>()) return json_value();
      return invalid(path, "the schema false allows no value");
    }
    if (!s.is_object()) return invalid(path, "a schema must be an object or a boolean");
    for (const auto& [k, v] : s.items()) {
      if (kAnnotations.count(k)) continue;
      if (!kKnown.count(k)) return unsupported(k, path);
      if (k == "uniqueItems" && !(v.is_boolean() && !v.get<bool>())) return unsupported(k, path, "only false");
      if (k == "propertyNames" && !is_any_string_schema(v))
        return unsupported(k, path, "only {\"type\": \"string\"}, which every key satisfies");
    }
    auto constraining = [&](const char* except) {
      for (const auto& [k, v] : s.items()) {
        if (!kAnnotations.count(k) && k != except && k != "type") return k;
      }
      return std::string();
    };
    // allOf, and $ref beside other keywords (draft 2019+: both apply), compile as one merged schema.
    if (s.contains("allOf") || (s.contains("$ref") && (!constraining("$ref").empty() || s.contains("type")))) {
      auto merged = merge_all_of(s, path, depth);
      if (!merged.ok()) return merged.status();
      return schema(*merged, path, hint, depth + 1);
    }
    if (s.contains("$ref")) return ref(s["$ref"], path);
    // oneOf as anyOf: the grammar does not exclude values matching several alternatives, so oneOf's
    // alternatives should be disjoint (zod's unions are: distinct types or discriminator consts).
    if (s.contains("anyOf") || s.contains("oneOf")) {
      const std::string key = s.contains("anyOf") ? "anyOf" : "oneOf";
      if (std::string other = constraining(key.c_str()); !other.empty() || s.contains("type"))
        return unsupported(other.empty() ? "type" : other, path, "beside " + key);
      const Json& alts = s[key];
      if (!alts.is_array() || alts.empty()) return invalid(path, key + " must be a non-empty array");
      std::string body;
      for (size_t i = 0; i < alts.size(); ++i) {
        auto e = schema(alts[i], path + "/" + key + "/" + std::to_string(i), hint, depth + 1);
        if (!e.ok()) return e;
        body += (i ? " | " : "") + *e;
      }
      return define(hint, body);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) types.push_back(t.get<std::string>());
      else if (t.is_array()) {
        for (const Json& x : t) {
          if (!x.is_string()) return invalid(path, "type must be a string or an array of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return invalid(path, "type must be a string or an array of strings");
      }
      if (types.empty()) return invalid(path, "type is an empty array");
      for (const auto& name : types) {
        if (std::find(std::begin(kTypes), std::end(kTypes), name) == std::end(kTypes))
          return invalid(path, "unknown type '" + name + "'");
      }
    }
    if (s.contains("enum") || s.contains("const")) {
      const bool is_enum = s.contains("enum");
      if (std::string other = constraining(is_enum ? "enum" : "const"); !other.empty())
        return unsupported(other, path, std::string("beside ") + (is_enum ? "enum" : "const"));
      Json values = is_enum ? s["enum"] : Json::array({s["const"]});
      if (!values.is_array() || values.empty()) return invalid(path, "enum must be a non-empty array");
      std::string body;
      for (const Json& v : values) {
        const bool typed = types.empty() || std::any_of(types.begin(), types.end(),
                                                        [&](const std::string& t) { return value_has_type(v, t); });
        if (!typed) continue;
        auto lit = literal(v);
        if (!lit.ok()) return lit.status();
        body += (body.empty() ? "" : " | ") + *lit;
      }
      if (body.empty()) return invalid(path, "no enum value has the schema's type");
      return define(hint, body);
    }
    if (types.empty()) {
      auto has_any = [&](const auto& keys) {
        return std::any_of(keys.begin(), keys.end(), [&](const std::string& k) { return s.contains(k); });
      };
      if (has_any(kObjectKeys)) types.push_back("object");
      else if (has_any(kArrayKeys)) types.push_back("array");
      else if (has_any(kStringKeys)) types.push_back("string");
      else if (has_any(kNumberKeys)) types.push_back("number");
      else return json_value();
    }
    std::string body;
    for (const auto& t : types) {
      auto e = typed(s, t, path, hint, depth);
      if (!e.ok()) return e;
      body += (body.empty() ? "" : " | ") + *e;
    }
    return types.size() == 1 && body.find(' ') == std::string::npos ? body : define(hint, body);
  }

  Result<std::string> typed(const Json& s, const std::string& t, const std::string& path, const std::string& hint,
                            int depth) {
    if (t == "null") return std::string("\"null\"");
    if (t == "boolean") return std::string("\"true\" | \"false\"");
    if (t == "integer" || t == "number") return number_rule(s, t == "integer", path, hint);
    if (t == "string") return string_rule(s, path, hint);
    if (t == "array") return array_rule(s, path, hint, depth);
    return object_rule(s, path, hint, depth);
  }

  // minKey/maxKey as [lo, hi] (hi < 0: no maximum).
  Result<std::pair<size_t, long>> bounds(const Json& s, const char* min_key, const char* max_key,
                                         const std::string& path) {
    size_t lo = 0;
    long hi = -1;
    if (s.contains(min_key)) {
      auto n = count(s, min_key, path);
      if (!n.ok()) return n.status();
      lo = *n;
    }
    if (s.contains(max_key)) {
      auto n = count(s, max_key, path);
      if (!n.ok()) return n.status();
      if (*n < lo) return invalid(path, std::string(max_key) + " below " + min_key);
      hi = long(*n);
    }
    return std::pair<size_t, long>(lo, hi);
  }

  // minimum / exclusiveMinimum (a number, or draft 4's boolean beside minimum) as the tighter lower
  // bound; likewise the upper one.
  Result<std::optional<NumberBound>> bound(const Json& s, const char* inclusive, const char* exclusive, bool lower,
                                           const std::string& path) {
    std::optional<NumberBound> out;
    auto read = [&](const char* key, bool excl) -> Status {
      const Json& v = s[key];
      if (!v.is_number() || !std::isfinite(v.get<double>())) return invalid(path, std::string(key) + " must be a number");
      NumberBound b{v.get<double>(), excl, std::nullopt};
      constexpr int64_t kExact = int64_t(1) << 53;
      if (v.is_number_integer() && (v.is_number_unsigned() ? v.get<uint64_t>() < uint64_t(kExact)
                                                           : std::llabs(v.get<int64_t>()) < kExact))
        b.integer = v.get<int64_t>();
      else if (std::abs(b.value) < double(kExact) && std::trunc(b.value) == b.value)
        b.integer = int64_t(b.value);
      const bool tighter = !out || (lower ? b.value > out->value || (b.value == out->value && excl)
                                          : b.value < out->value || (b.value == out->value && excl));
      if (tighter) out = b;
      return Status::Ok();
    };
    if (s.contains(exclusive) && s[exclusive].is_boolean()) {  // draft 4
      if (s[exclusive].get<bool>() && !s.contains(inclusive))
        return invalid(path, std::string(exclusive) + " true needs " + inclusive);
      if (s.contains(inclusive))
        if (Status st = read(inclusive, s[exclusive].get<bool>()); !st.ok()) return st;
      return out;
    }
    if (s.contains(inclusive))
      if (Status st = read(inclusive, false); !st.ok()) return st;
    if (s.contains(exclusive))
      if (Status st = read(exclusive, true); !st.ok()) return st;
    return out;
  }

  Result<std::string> number_rule(const Json& s, bool integer, const std::string& path, const std::string& hint) {
    const bool bounded = std::any_of(kNumberKeys.begin(), kNumberKeys.end(), [&](const std::string& k) { return s.contains(k); });
    if (!bounded) return integer ? json_int() : json_number();
    auto lo = bound(s, "minimum", "exclusiveMinimum", true, path);
    if (!lo.ok()) return lo.status();
    auto hi = bound(s, "maximum", "exclusiveMaximum", false, path);
    if (!hi.ok()) return hi.status();
    auto e = integer ? integer_range_gbnf(*lo, *hi) : number_range_gbnf(*lo, *hi);
    if (!e.ok()) return invalid(path, e.error());
    return define(hint + (integer ? "-int" : "-num"), *e);
  }

  // A pattern with a length (zod's `.email().max(n)`: pattern, format and maxLength): the pattern's
  // strings of those lengths, an automaton unrolled by length (bounded_pattern_gbnf); the format
  // then is the annotation it is beside a pattern. A format alone, or minLength without maxLength (an
  // unbounded unrolling), is refused.
  Result<std::string> bounded_pattern_rule(const Json& s, const std::string& path, const std::string& hint) {
    const char* length = s.contains("maxLength") ? "maxLength" : "minLength";
    if (!s.contains("pattern")) return unsupported(length, path, "beside format (only beside pattern)");
    if (!s.contains("maxLength")) return unsupported("minLength", path, "beside pattern without maxLength");
    if (!s["pattern"].is_string()) return invalid(path, "pattern must be a string");
    auto b = bounds(s, "minLength", "maxLength", path);
    if (!b.ok()) return b.status();
    auto content = bounded_pattern_gbnf(s["pattern"].get<std::string>(), b->first, size_t(b->second),
                                        // a numbered hint each: unique_name's probing stays one step per rule
                                        [&, k = 0](std::string body) mutable {
                                          return define(hint + "-len" + std::to_string(k++), std::move(body));
                                        });
    if (!content.ok()) return unsupported(length, path, "beside pattern: " + content.error());
    return define(hint, "\"\\\"\" " + *content + " \"\\\"\"");
  }

  Result<std::string> string_rule(const Json& s, const std::string& path, const std::string& hint) {
    if (s.contains("pattern") || s.contains("format")) {
      if (s.contains("minLength") || s.contains("maxLength")) return bounded_pattern_rule(s, path, hint);
      // Both: the pattern if the subset compiles it (format is an annotation in draft 2020-12), else
      // the format's grammar, whose strings are chosen to match the usual validation patterns (zod's
      // email pattern uses lookaheads).
      Result<std::string> content = Status::InvalidArgument("");
      if (s.contains("pattern")) {
        if (!s["pattern"].is_string()) return invalid(path, "pattern must be a string");
        content = pattern_gbnf(s["pattern"].get<std::string>());
        if (!content.ok() && !s.contains("format")) return unsupported("pattern", path, content.error());
      }
      if (!content.ok()) {
        if (!s["format"].is_string()) return invalid(path, "format must be a string");
        content = format_gbnf(s["format"].get<std::string>());
        if (!content.ok()) return unsupported("format", path, content.error());
      }
      return define(hint, "\"\\\"\" " + *content + " \"\\\"\"");
    }
    if (!s.contains("minLength") && !s.contains("maxLength")) return json_string();
    auto b = bounds(s, "minLength", "maxLength", path);
    if (!b.ok()) return b.status();
    const auto [lo, hi] = *b;
    return define(hint, "\"\\\"\" " + json_char() + "{" + std::to_string(lo) + "," +
                            (hi < 0 ? "" : std::to_string(hi)) + "} \"\\\"\"");
  }

  Result<std::string> array_rule(const Json& s, const std::string& path, const std::string& hint, int depth) {
    if (s.contains("prefixItems") || (s.contains("items") && s["items"].is_array())) {
      return tuple_rule(s, path, hint, depth);
    }
    if (s.contains("additionalItems")) return unsupported("additionalItems", path, "only beside an array of items");
    std::string item = "json-value";
    if (s.contains("items")) {
      auto e = schema(s["items"], path + "/items", hint + "-item", depth + 1);
      if (!e.ok()) return e;
      item = *e;
    } else {
      json_value();
    }
    auto b = bounds(s, "minItems", "maxItems", path);
    if (!b.ok()) return b.status();
    const auto [lo, hi] = *b;
    const std::string open = "\"[\" " + ws() + " ", close = " \"]\"";
    if (hi == 0) return define(hint, open + close.substr(1));
    auto more = [&](size_t m, long n) {  // ( sep item ){m,n}
      return "( " + sep() + " " + item + " ){" + std::to_string(m) + "," + (n < 0 ? "" : std::to_string(n)) + "}";
    };
    if (lo == 0)
      return define(hint, open + "( " + item + " " + more(0, hi < 0 ? -1 : hi - 1) + " " + ws() + " )?" + close);
    return define(hint, open + item + " " + more(lo - 1, hi < 0 ? -1 : hi - 1) + " " + ws() + close);
  }

  // prefixItems (or draft 7's array of items): every prefix item is written (up to maxItems), then
  // items (additionalItems) for the rest; with no schema for the rest, none is written.
  Result<std::string> tuple_rule(const Json& s, const std::string& path, const std::string& hint, int depth) {
    const bool draft7 = !s.contains("prefixItems");
    const char* prefix_key = draft7 ? "items" : "prefixItems";
    const char* rest_key = draft7 ? "additionalItems" : "items";
    if (!draft7 && s.contains("additionalItems")) return unsupported("additionalItems", path, "beside prefixItems");
    const Json& prefix = s[prefix_key];
    if (!prefix.is_array()) return invalid(path, std::string(prefix_key) + " must be an array of schemas");
    auto b = bounds(s, "minItems", "maxItems", path);
    if (!b.ok()) return b.status();
    const auto [lo, hi] = *b;
    const size_t written = hi < 0 ? prefix.size() : std::min(prefix.size(), size_t(hi));
    std::vector<std::string> items;
    for (size_t i = 0; i < written; ++i) {
      auto e = schema(prefix[i], path + "/" + prefix_key + "/" + std::to_string(i), hint + "-" + std::to_string(i),
                      depth + 1);
      if (!e.ok()) return e;
      items.push_back(*e);
    }
    std::string rest;  // the schema of items after the prefix ("" = none written)
    const Json* rest_schema = s.contains(rest_key) ? &s[rest_key] : nullptr;
    if (rest_schema && !(rest_schema->is_boolean() && !rest_schema->get<bool>())) {
      auto e = schema(*rest_schema, path + "/" + rest_key, hint + "-item", depth + 1);
      if (!e.ok()) return e;
      rest = *e;
    } else if (lo > prefix.size()) {
      if (rest_schema) return invalid(path, "minItems above the prefix items, with no more items allowed");
      rest = json_value();
    }
    const std::string open = "\"[\" " + ws(), close = " \"]\"";
    if (items.empty() && rest.empty()) return define(hint, open + close);
    std::string body;
    for (size_t i = 0; i < items.size(); ++i) body += (i ? " " + sep() + " " : " ") + items[i];
    if (!rest.empty() && (hi < 0 || size_t(hi) > written)) {
      const size_t more_lo = lo > written ? lo - written : 0;
      const std::string more_hi = hi < 0 ? "" : std::to_string(size_t(hi) - written);
      if (items.empty()) {  // as array_rule, with the prefix empty
        body = more_lo == 0 ? " ( " + rest + " ( " + sep() + " " + rest + " ){0," +
                                  (hi < 0 ? "" : std::to_string(size_t(hi) - 1)) + "} )?"
                            : " " + rest + " ( " + sep() + " " + rest + " ){" + std::to_string(more_lo - 1) + "," +
                                  (hi < 0 ? "" : std::to_string(size_t(hi) - 1)) + "}";
      } else {
        body += " ( " + sep() + " " + rest + " ){" + std::to_string(more_lo) + "," + more_hi + "}";
      }
    }
    return define(hint, open + body + " " + ws() + close);
  }

  // ------------------------------------------------------------------------------------ allOf
  // allOf parts (and $ref beside other keywords) merged into one schema: properties of every part
  // (a property in two parts: allOf of its schemas), required of every part, the types in common,
  // the tighter of bounds; other keywords must agree. A part with additionalProperties false allows
  // only its own properties: the others' optional ones are dropped, a required one is an error.
  Result<Json> merge_all_of(const Json& s, const std::string& path, int depth) {
    Json acc = Json::object();
    std::vector<std::set<std::string>> closed;
    if (Status st = merge_part(acc, s, path, depth, closed); !st.ok()) return st;
    for (const auto& allowed : closed) {
      if (!acc.contains("properties")) continue;
      Json kept = Json::object();
      for (const auto& [k, v] : acc["properties"].items()) {
        if (allowed.count(k)) kept[k] = v;
        else if (acc.contains("required") && std::find(acc["required"].begin(), acc["required"].end(), k) !=
                                                  acc["required"].end())
          return invalid(path, "required property '" + k + "' is excluded by additionalProperties false in allOf");
      }
      acc["properties"] = std::move(kept);
    }
    return acc;
  }

  Status merge_part(Json& acc, const Json& part, const std::string& path, int depth,
                    std::vector<std::set<std::string>>& closed) {
    if (depth > kMaxSchemaDepth) return invalid(path, "allOf or $ref nested deeper than " + std::to_string(kMaxSchemaDepth));
    if (part.is_boolean()) return part.get<bool>() ? Status::Ok() : invalid(path, "the schema false allows no value");
    if (!part.is_object()) return invalid(path, "a schema must be an object or a boolean");
    for (const auto& [k, v] : part.items()) {
      if (kAnnotations.count(k)) continue;
      if (k == "allOf") {
        if (!v.is_array() || v.empty()) return invalid(path, "allOf must be a non-empty array");
        for (size_t i = 0; i < v.size(); ++i)
          if (Status st = merge_part(acc, v[i], path + "/allOf/" + std::to_string(i), depth + 1, closed); !st.ok())
            return st;
      } else if (k == "$ref") {
        auto target = resolve(v, path);
        if (!target.ok()) return target.status();
        if (Status st = merge_part(acc, *target->second, target->first, depth + 1, closed); !st.ok()) return st;
      } else if (Status st = merge_keyword(acc, k, v, path); !st.ok()) {
        return st;
      }
    }
    if (part.contains("additionalProperties") && part["additionalProperties"] == false) {
      std::set<std::string> own;
      if (part.contains("properties") && part["properties"].is_object())
        for (const auto& [k, v] : part["properties"].items()) own.insert(k);
      closed.push_back(std::move(own));
    }
    return Status::Ok();
  }

  Status merge_keyword(Json& acc, const std::string& k, const Json& v, const std::string& path) {
    if (!acc.contains(k)) {
      acc[k] = v;
      return Status::Ok();
    }
    Json& a = acc[k];
    if (a == v) return Status::Ok();
    if (k == "properties" && a.is_object() && v.is_object()) {
      for (const auto& [p, sub] : v.items()) {
        if (!a.contains(p)) a[p] = sub;
        else if (a[p] != sub) a[p] = Json{{"allOf", Json::array({a[p], sub})}};
      }
      return Status::Ok();
    }
    if (k == "required" && a.is_array() && v.is_array()) {
      for (const Json& r : v)
        if (std::find(a.begin(), a.end(), r) == a.end()) a.push_back(r);
      return Status::Ok();
    }
    if (k == "type") {
      auto names = [](const Json& t) {
        std::set<std::string> out;
        if (t.is_string()) out.insert(t.get<std::string>());
        else if (t.is_array())
          for (const Json& x : t)
            if (x.is_string()) out.insert(x.get<std::string>());
        return out;
      };
      const auto x = names(a), y = names(v);
      Json common = Json::array();
      for (const auto& t : x) {
        if (y.count(t)) common.push_back(t);
        else if (t == "integer" && y.count("number")) common.push_back(t);
        else if (t == "number" && y.count("integer")) common.push_back("integer");
      }
      if (common.empty()) return invalid(path, "allOf parts have no type in common");
      a = std::move(common);
      return Status::Ok();
    }
    if ((kLowerBounds.count(k) || kUpperBounds.count(k)) && a.is_number() && v.is_number()) {
      const bool take = kLowerBounds.count(k) ? v.get<double>() > a.get<double>() : v.get<double>() < a.get<double>();
      if (take) a = v;
      return Status::Ok();
    }
    if (k == "additionalProperties") {
      if (a == false || v == false) a = false;
      else if (a == true) a = v;
      else if (v != true) a = Json{{"allOf", Json::array({a, v})}};
      return Status::Ok();
    }
    return unsupported(k, path, "with different values in allOf parts");
  }

  Result<std::string> object_rule(const Json& s, const std::string& path, const std::string& hint, int depth) {
    struct Prop {
      std::string key_literal, value;
      bool required;
    };
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return invalid(path, "required must be an array of strings");
      for (const Json& r : s["required"]) {
        if (!r.is_string()) return invalid(path, "required must be an array of strings");
        required.insert(r.get<std::string>());
      }
    }
    const Json empty = Json::object();
    const Json& props = s.contains("properties") ? s["properties"] : empty;
    if (!props.is_object()) return invalid(path, "properties must be an object");
    const Json* extra = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    if (extra && !extra->is_boolean() && !extra->is_object())
      return invalid(path, "additionalProperties must be a boolean or a schema");
    if (props.empty() && required.empty()) {
      if (extra && extra->is_boolean() && !extra->get<bool>()) return define(hint, "\"{\" " + ws() + " \"}\"");
      if (!extra || extra->is_boolean()) return json_object();
      auto v = schema(*extra, path + "/additionalProperties", hint + "-value", depth + 1);
      if (!v.ok()) return v;
      const std::string pair = json_string() + " " + colon() + " " + *v;
      return define(hint, "\"{\" " + ws() + " ( " + pair + " ( " + sep() + " " + pair + " )* " + ws() + " )? \"}\"");
    }
    std::vector<Prop> list;
    for (const auto& [key, sub] : props.items()) {
      auto lit = literal(Json(key));
      if (!lit.ok()) return lit.status();
      auto v = schema(sub, path + "/properties/" + key, hint + "-" + key, depth + 1);
      if (!v.ok()) return v;
      list.push_back({*lit, *v, required.count(key) > 0});
    }
    for (const std::string& key : required) {  // required but not described: additionalProperties
      if (props.contains(key)) continue;
      if (extra && extra->is_boolean() && !extra->get<bool>())
        return invalid(path, "required property '" + key + "' is excluded by additionalProperties false");
      auto lit = literal(Json(key));
      if (!lit.ok()) return lit.status();
      auto v = extra && extra->is_object() ? schema(*extra, path + "/additionalProperties", hint + "-" + key, depth + 1)
                                           : Result<std::string>(json_value());
      if (!v.ok()) return v;
      list.push_back({*lit, *v, true});
    }
    // F(i): a non-empty list of the properties from i on, nothing written before it; T(i): the rest
    // of the list from i on, each present one after a comma.
    const size_t n = list.size();
    auto kv = [&](size_t i) { return list[i].key_literal + " " + colon() + " " + list[i].value; };
    std::vector<std::string> rest(n + 1);  // T(i) as an expression ("" for nothing)
    for (size_t i = n; i-- > 0;) {
      std::string body = list[i].required ? sep() + " " + kv(i) : "( " + sep() + " " + kv(i) + " )?";
      if (!rest[i + 1].empty()) body += " " + rest[i + 1];
      rest[i] = list[i].required || rest[i + 1].empty() ? body : define(hint + "-rest", body);
    }
    std::string first;  // F(0)
    for (size_t i = n; i-- > 0;) {
      std::string body = kv(i) + (rest[i + 1].empty() ? "" : " " + rest[i + 1]);
      if (!list[i].required && !first.empty()) body += " | " + first;
      first = define(hint + "-props", body);
    }
    const bool any_required = std::any_of(list.begin(), list.end(), [](const Prop& p) { return p.required; });
    return define(hint, "\"{\" " + ws() + " " + (any_required ? first + " " + ws() : "( " + first + " " + ws() + " )?") +
                            " \"}\"");
  }

  Result<std::string> ref(const Json& r, const std::string& path) {
    if (!r.is_string()) return invalid(path, "$ref must be a string");
    const std::string target = r.get<std::string>();
    if (auto it = ref_rules.find(target); it != ref_rules.end()) return it->second;
    auto at = resolve(r, path);
    if (!at.ok()) return at.status();
    std::string last = doc_name;
    if (const size_t slash = target.rfind('/'); slash != std::string::npos)
      last = unescape_pointer_token(std::string_view(target).substr(slash + 1));
    // Name the rule first, so that the target may refer to itself.
    const std::string name = unique_name(doc_name + "-" + last);
    ref_rules.emplace(target, name);
    const size_t slot = rules.size();
    rules.emplace_back(name, "");
    auto body = schema(*at->second, target, name, 0);
    if (!body.ok()) return body;
    rules[slot].second = *body;
    return name;
  }

  // A schema can be well formed and still have no grammar: a $ref cycle that writes nothing before it
  // comes back to itself (left recursion), or a required reference to itself (no value is finite).
  // Refused here, as the client's error, so that a tool's parameters never make a tool-call grammar
  // that does not compile (a 500). Any other compile error is a bug of this converter: internal.
  Status check_compiles(const std::string& expression) const {
    std::string text = "root ::= " + expression + "\n";
    for (const auto& [name, body] : rules) {
      if (!caller_rules.count(name)) text += name + " ::= " + body + "\n";
    }
    auto g = Grammar::parse(text);
    if (g.ok()) return Status::Ok();
    const std::string& why = g.error();
    if (why.find("left recursion") != std::string::npos) {
      const size_t open = why.find('('), close = why.find(')');
      return Status::InvalidArgument("JSON schema: a $ref cycle comes back to itself before any character is written (" +
                                     why.substr(open + 1, close - open - 1) + "), so it describes no value");
    }
    if (why.find("can never finish") != std::string::npos)
      return Status::InvalidArgument("JSON schema: no finite value is valid (every value must contain another one "
                                     "through a required $ref)");
    return Status::Error("internal: the JSON schema's grammar does not compile: " + why);
  }

  // A local reference's target (its path, the schema).
  Result<std::pair<std::string, const Json*>> resolve(const Json& r, const std::string& path) {
    if (!r.is_string()) return invalid(path, "$ref must be a string");
    const std::string target = r.get<std::string>();
    if (target.empty() || target[0] != '#')
      return unsupported("$ref", path, "only references inside the schema (\"#...\") are supported, not " + target);
    const Json* at = doc;
    if (target.size() > 1) {
      if (target[1] != '/') return unsupported("$ref", path, "anchors are not supported: " + target);
      size_t pos = 2;
      while (pos <= target.size()) {
        size_t end = target.find('/', pos);
        if (end == std::string::npos) end = target.size();
        const std::string tok = unescape_pointer_token(std::string_view(target).substr(pos, end - pos));
        if (at->is_object() && at->contains(tok)) {
          at = &(*at)[tok];
        } else if (at->is_array() && !tok.empty() && std::all_of(tok.begin(), tok.end(), ::isdigit) &&
                   std::stoul(tok) < at->size()) {
          at = &(*at)[std::stoul(tok)];
        } else {
          return invalid(path, "$ref " + target + " does not resolve");
        }
        pos = end + 1;
      }
    }
    return std::pair<std::string, const Json*>(target, at);
  }
};

JsonGrammarBuilder::JsonGrammarBuilder() : impl_(std::make_unique<Impl>()) { impl_->names.insert("root"); }
JsonGrammarBuilder::~JsonGrammarBuilder() = default;

Result<std::string> JsonGrammarBuilder::add_schema(std::string_view schema_json, std::string_view name) {
  Json doc = Json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Status::InvalidArgument("JSON schema: not valid JSON");
  impl_->doc = &doc;
  impl_->doc_name = sanitize(name);
  impl_->ref_rules.clear();
  auto e = impl_->schema(doc, "#", impl_->doc_name, 0);
  impl_->doc = nullptr;
  if (!e.ok()) return e;
  if (Status s = impl_->check_compiles(*e); !s.ok()) return s;
  // A named rule, so that callers can reference it whatever the expression is.
  if (impl_->names.count(*e) && e->find(' ') == std::string::npos) return *e;
  return impl_->define(impl_->doc_name, *e);
}

std::string JsonGrammarBuilder::any_value() { return impl_->json_value(); }
std::string JsonGrammarBuilder::any_object() { return impl_->json_object(); }
std::string JsonGrammarBuilder::any_string() { return impl_->json_string(); }
std::string JsonGrammarBuilder::ws() { return impl_->ws(); }

std::string JsonGrammarBuilder::add_rule(std::string_view name, std::string_view body) {
  std::string n = impl_->unique_name(name);
  impl_->caller_rules.insert(n);
  impl_->rules.emplace_back(n, std::string(body));
  return n;
}

std::string JsonGrammarBuilder::gbnf(std::string_view root_body) const {
  std::string out = "root ::= " + std::string(root_body) + "\n";
  for (const auto& [name, body] : impl_->rules) out += name + " ::= " + body + "\n";
  return out;
}

Result<std::string> json_schema_to_gbnf(std::string_view schema_json) {
  JsonGrammarBuilder b;
  auto rule = b.add_schema(schema_json, "schema");
  if (!rule.ok()) return rule;
  return b.gbnf(*rule);
}

std::string json_object_gbnf() {
  JsonGrammarBuilder b;
  return b.gbnf(b.any_object());
}

}  // namespace towers
