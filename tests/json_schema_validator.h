// An independent JSON Schema validator for the subset engine/constrained/json_schema.h compiles, written from the
// specification (draft 2020-12 semantics for these keywords) over nlohmann::json, for checking that
// whatever the grammar lets a model write is valid. It shares no code with the compiler.
#pragma once
#include <cmath>
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
    }
    if (v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return at + ": fewer than minItems";
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return at + ": more than maxItems";
      if (s.contains("items")) {
        for (size_t i = 0; i < v.size(); ++i)
          if (auto e = check(v[i], s["items"], at + "[" + std::to_string(i) + "]"); !e.empty()) return e;
      }
    }
    if (v.is_object()) {
      if (s.contains("required")) {
        for (const auto& r : s["required"])
          if (!v.contains(r.get<std::string>())) return at + ": missing required " + r.get<std::string>();
      }
      for (auto it = v.begin(); it != v.end(); ++it) {
        const std::string path = at + "." + it.key();
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
