// An independent JSON Schema validator for the subset engine/constrained/json_schema.h compiles, written from the
// specification (draft 2020-12 semantics for these keywords) over nlohmann::json, for checking that
// whatever the grammar lets a model write is valid. It shares no code with the compiler.
#pragma once
#include <cmath>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

namespace towers::test {

class SchemaValidator {
 public:
  explicit SchemaValidator(nlohmann::json root) : root_(std::move(root)) {}

  // Empty when valid, else the first reason found (with a JSON-pointer-like path).
  std::string check(const nlohmann::json& v) const { return check(v, root_, "$"); }

 private:
  static size_t code_points(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }
  // UTF-8 as code points, so that a regex's '.' and classes see characters, not bytes.
  static std::wstring wide(const std::string& s) {
    std::wstring out;
    for (size_t i = 0; i < s.size();) {
      const unsigned char b = s[i];
      const int len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
      uint32_t cp = len == 1 ? b : len == 2 ? b & 0x1F : len == 3 ? b & 0x0F : b & 0x07;
      for (int k = 1; k < len && i + size_t(k) < s.size(); ++k) cp = (cp << 6) | (uint8_t(s[i + size_t(k)]) & 0x3F);
      out += wchar_t(cp);
      i += size_t(len);
    }
    return out;
  }
  static bool has_type(const nlohmann::json& v, const std::string& t) {
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") {
      if (v.is_number_integer()) return true;
      return v.is_number_float() && std::isfinite(v.get<double>()) && std::floor(v.get<double>()) == v.get<double>();
    }
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    return false;
  }
  // JSON equality with numbers compared by value (1 == 1.0), as JSON Schema requires.
  static bool equal(const nlohmann::json& a, const nlohmann::json& b) {
    if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
    if (a.type() != b.type()) return false;
    if (a.is_array()) {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i)
        if (!equal(a[i], b[i])) return false;
      return true;
    }
    if (a.is_object()) {
      if (a.size() != b.size()) return false;
      for (auto it = a.begin(); it != a.end(); ++it)
        if (!b.contains(it.key()) || !equal(it.value(), b[it.key()])) return false;
      return true;
    }
    return a == b;
  }
  // Formats as assertions (RFC 3339 date, full-time, date-time; RFC 4122 uuid; an addr-spec with a
  // dot-atom local part and a host name domain), checked with std::regex and the calendar.
  static bool valid_format(const std::string& format, const std::string& v) {
    static const std::regex date(R"(^(\d{4})-(\d{2})-(\d{2})$)");
    static const std::regex time(R"(^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)$)");
    static const std::regex uuid(R"(^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)");
    static const std::regex email(
        R"(^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)+$)");
    auto valid_date = [](const std::string& d) {
      std::smatch m;
      if (!std::regex_match(d, m, date)) return false;
      const int y = std::stoi(m[1]), mo = std::stoi(m[2]), day = std::stoi(m[3]);
      const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
      const int days[] = {31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
      return mo >= 1 && mo <= 12 && day >= 1 && day <= days[mo - 1];
    };
    if (format == "date") return valid_date(v);
    if (format == "time") return std::regex_match(v, time);
    if (format == "date-time") {
      const size_t t = v.find_first_of("Tt");
      return t != std::string::npos && valid_date(v.substr(0, t)) && std::regex_match(v.substr(t + 1), time);
    }
    if (format == "uuid") return std::regex_match(v, uuid);
    if (format == "email") return std::regex_match(v, email);
    return true;  // other formats are annotations
  }
  // v < bound (either may be the schema's), exactly for integers.
  static bool below(const nlohmann::json& bound, const nlohmann::json& v) {
    if (bound.is_number_integer() && v.is_number_integer()) return v.get<int64_t>() < bound.get<int64_t>();
    return v.get<double>() < bound.get<double>();
  }
  static bool equal_number(const nlohmann::json& bound, const nlohmann::json& v) {
    if (bound.is_number_integer() && v.is_number_integer()) return v.get<int64_t>() == bound.get<int64_t>();
    return v.get<double>() == bound.get<double>();
  }

  const nlohmann::json& resolve(const std::string& ref) const {
    return ref == "#" ? root_ : root_.at(nlohmann::json::json_pointer(ref.substr(1)));
  }

  std::string check(const nlohmann::json& v, const nlohmann::json& s, const std::string& at) const {
    if (s.is_boolean()) return s.get<bool>() ? "" : at + ": schema false";
    if (s.contains("$ref")) {
      if (auto e = check(v, resolve(s["$ref"].get<std::string>()), at); !e.empty()) return e;
    }
    if (s.contains("anyOf")) {
      bool any = false;
      for (const auto& alt : s["anyOf"]) any = any || check(v, alt, at).empty();
      if (!any) return at + ": matches no anyOf alternative";
    }
    if (s.contains("oneOf")) {
      int matches = 0;
      for (const auto& alt : s["oneOf"]) matches += check(v, alt, at).empty();
      if (matches != 1) return at + ": matches " + std::to_string(matches) + " oneOf alternatives";
    }
    if (s.contains("allOf")) {
      for (const auto& part : s["allOf"])
        if (auto e = check(v, part, at); !e.empty()) return e;
    }
    if (s.contains("enum")) {
      bool any = false;
      for (const auto& e : s["enum"]) any = any || equal(v, e);
      if (!any) return at + ": not in enum";
    }
    if (s.contains("const") && !equal(v, s["const"])) return at + ": not the const";
    if (s.contains("type")) {
      bool ok = false;
      if (s["type"].is_string()) ok = has_type(v, s["type"].get<std::string>());
      else
        for (const auto& t : s["type"]) ok = ok || has_type(v, t.get<std::string>());
      if (!ok) return at + ": wrong type " + std::string(v.type_name());
    }
    if (v.is_string()) {
      const size_t n = code_points(v.get<std::string>());
      if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return at + ": shorter than minLength";
      if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return at + ": longer than maxLength";
      if (s.contains("pattern") && !std::regex_search(wide(v.get<std::string>()),
                                                      std::wregex(wide(s["pattern"].get<std::string>()), std::regex::ECMAScript)))
        return at + ": does not match the pattern";
      if (s.contains("format") && !valid_format(s["format"].get<std::string>(), v.get<std::string>()))
        return at + ": not a valid " + s["format"].get<std::string>();
    }
    if (v.is_number()) {
      // Draft 4's boolean exclusiveMinimum/exclusiveMaximum make minimum/maximum exclusive.
      const bool min_excl = s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean() &&
                            s["exclusiveMinimum"].get<bool>();
      const bool max_excl = s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean() &&
                            s["exclusiveMaximum"].get<bool>();
      if (s.contains("minimum") && (below(s["minimum"], v) || (min_excl && equal_number(s["minimum"], v))))
        return at + ": below minimum";
      if (s.contains("maximum") && (below(v, s["maximum"]) || (max_excl && equal_number(s["maximum"], v))))
        return at + ": above maximum";
      if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_number() &&
          (below(s["exclusiveMinimum"], v) || equal_number(s["exclusiveMinimum"], v)))
        return at + ": not above exclusiveMinimum";
      if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_number() && !below(s["exclusiveMaximum"], v))
        return at + ": not below exclusiveMaximum";
    }
    if (v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return at + ": fewer than minItems";
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return at + ": more than maxItems";
      // prefixItems then items (2020-12), or draft 7's items array then additionalItems.
      const bool draft7 = s.contains("items") && s["items"].is_array();
      const nlohmann::json none = nlohmann::json::array();
      const nlohmann::json& prefix = s.contains("prefixItems") ? s["prefixItems"] : draft7 ? s["items"] : none;
      const char* rest = draft7 ? "additionalItems" : "items";
      for (size_t i = 0; i < v.size(); ++i) {
        const std::string path = at + "[" + std::to_string(i) + "]";
        if (i < prefix.size()) {
          if (auto e = check(v[i], prefix[i], path); !e.empty()) return e;
        } else if (s.contains(rest)) {
          if (auto e = check(v[i], s[rest], path); !e.empty()) return e;
        }
      }
    }
    if (v.is_object()) {
      if (s.contains("required")) {
        for (const auto& r : s["required"])
          if (!v.contains(r.get<std::string>())) return at + ": missing required " + r.get<std::string>();
      }
      for (auto it = v.begin(); it != v.end(); ++it) {
        const std::string path = at + "." + it.key();
        if (s.contains("propertyNames"))
          if (auto e = check(nlohmann::json(it.key()), s["propertyNames"], path + " (name)"); !e.empty()) return e;
        if (s.contains("properties") && s["properties"].contains(it.key())) {
          if (auto e = check(it.value(), s["properties"][it.key()], path); !e.empty()) return e;
        } else if (s.contains("additionalProperties")) {
          if (auto e = check(it.value(), s["additionalProperties"], path); !e.empty()) return e;
        }
      }
    }
    return "";
  }

  nlohmann::json root_;
};

}  // namespace towers::test
