// JSON Schema → grammar: JSON-Schema-Test-Suite-style cases (each instance fed as bytes must be
// accepted exactly when it is valid; the independent validator of json_schema_validator.h agrees on
// every case first), errors naming unsupported keywords, and sampling under token masks (random
// logits, seeded) on real vocabularies: every completed output parses and validates.
#include <random>
#include <span>

#include <nlohmann/json.hpp>

#include "engine/generate/generate.h"
#include "engine/constrained/grammar_matcher.h"
#include "engine/constrained/json_schema.h"
#include "engine/generate/sampler.h"
#include "grammar_fixtures.h"
#include "json_schema_validator.h"
#include "model_fixtures.h"
#include "test_support.h"
#include "vocab_fixtures.h"

using namespace towers;
using nlohmann::json;

namespace {

std::shared_ptr<const Grammar> schema_grammar(const std::string& schema) {
  auto gbnf = json_schema_to_gbnf(schema);
  REQUIRE_MESSAGE(gbnf.ok(), gbnf.error());
  auto g = Grammar::parse(*gbnf);
  REQUIRE_MESSAGE(g.ok(), g.error() << "\n" << *gbnf);
  return *g;
}

bool accepts(const std::shared_ptr<const Grammar>& g, std::string_view text) { return test::grammar_accepts(g, text); }

struct Instance {
  const char* text;  // as the grammar would write it
  bool valid;
};
struct Case {
  const char* description;
  const char* schema;
  std::vector<Instance> tests;
};

// In the JSON-Schema-Test-Suite's shape: a schema and instances marked valid or not. Valid instances
// are written the way the grammar generates them (schema property order, at most one space).
const std::vector<Case> kCases = {
    {"type string", R"({"type": "string"})",
     {{R"("abc")", true}, {R"("")", true}, {R"("caf\u00e9 \"q\" \\ \n")", true}, {"\"caf\xC3\xA9\"", true},
      {"12", false}, {"null", false}, {R"(["a"])", false}, {"\"a\x01\"", false}, {R"("\ud800")", false}}},
    {"type integer", R"({"type": "integer"})",
     {{"0", true}, {"-17", true}, {"1234567890123456", true}, {"1.5", false}, {"\"1\"", false},
      {"01", false}, {"true", false}}},
    {"type number", R"({"type": "number"})",
     {{"0", true}, {"-0.25", true}, {"1e10", true}, {"6.02E+23", true}, {"1.", false}, {".5", false},
      {"+1", false}, {"NaN", false}}},
    {"type boolean and null", R"({"type": ["boolean", "null"]})",
     {{"true", true}, {"false", true}, {"null", true}, {"0", false}, {"\"true\"", false}}},
    {"string length in code points", R"({"type": "string", "minLength": 2, "maxLength": 3})",
     {{R"("ab")", true}, {"\"\xC3\xA9\xC3\xA9\xC3\xA9\"", true}, {R"("\n\t")", true}, {R"("a")", false},
      {R"("abcd")", false}, {"\"\xC3\xA9\"", false}}},
    {"enum of mixed values", R"({"enum": ["red", 3, null, {"a": [1]}]})",
     {{R"("red")", true}, {"3", true}, {"null", true}, {R"({"a":[1]})", true}, {R"("blue")", false},
      {"4", false}, {R"({"a":[2]})", false}}},
    {"enum filtered by type", R"({"type": "string", "enum": ["x", 1]})",
     {{R"("x")", true}, {"1", false}}},
    {"const", R"({"const": "fixed"})", {{R"("fixed")", true}, {R"("other")", false}}},
    {"object, all required, no additional",
     R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
         "required": ["name", "age"], "additionalProperties": false})",
     {{R"({"name": "Ann", "age": 7})", true}, {R"({"name":"Ann","age":7})", true},
      {"{\n  \"name\": \"Ann\",\n  \"age\": 7\n}", true}, {R"({"name": "Ann"})", false},
      {R"({"name": "Ann", "age": 7, "x": 1})", false}, {R"({"name": 1, "age": 7})", false}, {"{}", false}}},
    {"optional properties keep their order",
     R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
         "c": {"type": "integer"}}, "required": ["b"], "additionalProperties": false})",
     {{R"({"b": 2})", true}, {R"({"a": 1, "b": 2})", true}, {R"({"b": 2, "c": 3})", true},
      {R"({"a": 1, "b": 2, "c": 3})", true}, {R"({"a": 1})", false}, {R"({"a": 1, "c": 3})", false},
      {"{}", false}, {R"({"b": 2,})", false}}},
    {"all optional", R"({"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}},
                         "additionalProperties": false})",
     {{"{}", true}, {"{ }", true}, {R"({"a": null})", true}, {R"({"b": null})", true},
      {R"({"a": null, "b": null})", true}, {R"({"a": 1})", false}, {R"({, "b": null})", false}}},
    {"required but not described", R"({"type": "object", "required": ["x"]})",
     {{R"({"x": [1, {"y": "z"}]})", true}, {R"({})", false}}},
    {"required but not described, typed by additionalProperties",
     R"({"type": "object", "required": ["x"], "additionalProperties": {"type": "integer"}})",
     {{R"({"x": 1})", true}, {R"({"x": "1"})", false}}},
    {"additionalProperties as a schema", R"({"type": "object", "additionalProperties": {"type": "integer"}})",
     {{R"({"p": 1, "q": 2})", true}, {"{}", true}, {R"({"p": "1"})", false}}},
    {"empty object only", R"({"type": "object", "additionalProperties": false})",
     {{"{}", true}, {R"({"a": 1})", false}}},
    {"any object", R"({"type": "object"})",
     {{R"({"a": [1, 2.5, "x", null, true, {"b": {}}]})", true}, {"{}", true}, {"[]", false}}},
    {"array items and bounds", R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})",
     {{"[1]", true}, {"[1, 2, 3]", true}, {"[]", false}, {"[1, 2, 3, 4]", false}, {R"([1, "2"])", false},
      {"[1,]", false}}},
    {"array without bounds", R"({"type": "array"})", {{"[]", true}, {R"([1, [], {}])", true}, {"{}", false}}},
    {"array of nothing", R"({"type": "array", "maxItems": 0})", {{"[]", true}, {"[1]", false}}},
    {"nullable through anyOf", R"({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "null"}]})",
     {{R"("ab")", true}, {"null", true}, {R"("abc")", false}, {"1", false}}},
    {"nullable through a type array", R"({"type": ["string", "null"], "maxLength": 1})",
     {{R"("a")", true}, {"null", true}, {R"("ab")", false}}},
    {"$ref to $defs", R"({"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "number"}},
                          "required": ["x"], "additionalProperties": false}},
                          "type": "array", "items": {"$ref": "#/$defs/pt"}})",
     {{R"([{"x": 1}, {"x": 2.5}])", true}, {R"([{"y": 1}])", false}}},
    {"$ref to definitions", R"({"definitions": {"s": {"type": "string"}}, "$ref": "#/definitions/s"})",
     {{R"("a")", true}, {"1", false}}},
    {"recursive $ref", R"({"type": "object", "properties": {"v": {"type": "integer"},
                           "kids": {"type": "array", "items": {"$ref": "#"}}},
                           "required": ["v", "kids"], "additionalProperties": false})",
     {{R"({"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]})", true},
      {R"({"v": 1, "kids": [{"v": 2}]})", false}}},
    {"boolean schema true", "true", {{"1", true}, {R"({"a": [null]})", true}}},
    {"annotations are ignored", R"({"type": "integer", "title": "t", "description": "d", "default": 1,
                                    "examples": [2], "$comment": "c"})",
     {{"5", true}, {"\"5\"", false}}},
    // ----------------------------------------------------------------- numeric bounds
    {"integer bounds", R"({"type": "integer", "minimum": -5, "maximum": 123})",
     {{"-5", true}, {"0", true}, {"7", true}, {"99", true}, {"100", true}, {"123", true}, {"-6", false},
      {"124", false}, {"130", false}, {"1000", false}, {"-10", false}, {"5.5", false}, {"00", false}}},
    {"zod's .int(): the safe integer range", R"({"type": "integer", "minimum": -9007199254740991,
                                                 "maximum": 9007199254740991})",
     {{"9007199254740991", true}, {"-9007199254740991", true}, {"0", true}, {"42", true},
      {"9007199254740990", true}, {"8999999999999999", true}, {"9007199254740992", false},
      {"-9007199254740992", false}, {"9100000000000000", false}, {"10000000000000000", false}}},
    {"exclusive integer bounds", R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10})",
     {{"1", true}, {"9", true}, {"0", false}, {"10", false}, {"-1", false}}},
    {"draft 4 boolean exclusiveMinimum", R"({"type": "integer", "minimum": 3, "exclusiveMinimum": true})",
     {{"4", true}, {"40", true}, {"3", false}, {"2", false}}},
    {"integer with fractional bounds", R"({"type": "integer", "minimum": 1.5, "maximum": 3.5})",
     {{"2", true}, {"3", true}, {"1", false}, {"4", false}}},
    {"number between 0 and 1", R"({"type": "number", "minimum": 0, "maximum": 1})",
     {{"0", true}, {"1", true}, {"0.5", true}, {"0.999", true}, {"1.5", false}, {"-0.5", false}, {"2", false}}},
    {"positive number (exclusiveMinimum 0)", R"({"type": "number", "exclusiveMinimum": 0})",
     {{"0.5", true}, {"0.001", true}, {"3", true}, {"2.25", true}, {"0", false}, {"0.0", false}, {"-1", false},
      {"-0.5", false}}},
    {"negative numbers", R"({"type": "number", "maximum": -2.5})",
     {{"-3", true}, {"-4.75", true}, {"-100", true}, {"-2", false}, {"-2.4", false}, {"0", false}}},
    {"numbers below an exclusive 0", R"({"type": "number", "minimum": -1, "exclusiveMaximum": 0})",
     {{"-1", true}, {"-0.5", true}, {"0", false}, {"-1.5", false}, {"0.5", false}}},
    {"nullable integer with a bound", R"({"type": ["integer", "null"], "minimum": 1})",
     {{"1", true}, {"null", true}, {"0", false}, {"\"1\"", false}}},
    // ----------------------------------------------------------------- pattern
    {"pattern: classes and counts", R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"})",
     {{R"("AB-123")", true}, {R"("ZZ-000")", true}, {R"("ab-123")", false}, {R"("AB-12")", false},
      {R"("AB-1234")", false}, {R"("AB_123")", false}}},
    {"pattern: groups, alternation, +, ?", R"({"type": "string", "pattern": "^(?:foo|ba[rz])+(\\.x)?$"})",
     {{R"("foo")", true}, {R"("barbaz")", true}, {R"("foo.x")", true}, {R"("")", false}, {R"("fo")", false},
      {R"("foo.")", false}, {R"("foox")", false}}},
    {"pattern: quotes and backslashes are written escaped", R"({"type": "string", "pattern": "^a\"b\\\\c$"})",
     {{R"("a\"b\\c")", true}, {R"("ab\\c")", false}, {R"("a\"bc")", false}}},
    {"pattern: unanchored matches anywhere", R"({"type": "string", "pattern": "ab"})",
     {{R"("xxabyy")", true}, {R"("ab")", true}, {R"("a b")", false}}},
    {"pattern: '.' is any character but a line break", R"({"type": "string", "pattern": "^.{2}$"})",
     {{"\"\xC3\xA9" "1\"", true}, {R"("\"1")", true}, {R"("a\n")", false}, {R"("abc")", false}}},
    {"pattern: a negated class", R"({"type": "string", "pattern": "^[^0-9]+$"})",
     {{R"("abc")", true}, {R"("\"")", true}, {R"("a1")", false}, {R"("")", false}}},
    {"pattern: {m,} and \\w, \\s", R"({"type": "string", "pattern": "^\\w{3,}\\s\\w$"})",
     {{R"("abc d")", true}, {R"("a_cde\tf")", true}, {R"("ab d")", false}, {R"("abc  d")", false}}},
    // ----------------------------------------------------------------- format
    {"format date", R"({"type": "string", "format": "date"})",
     {{R"("2024-02-28")", true}, {R"("2024-12-31")", true}, {R"("1999-04-30")", true}, {R"("2024-02-30")", false},
      {R"("2024-04-31")", false}, {R"("2024-13-01")", false}, {R"("24-01-01")", false}, {R"("2024-1-01")", false}}},
    {"format time", R"({"type": "string", "format": "time"})",
     {{R"("12:30:59Z")", true}, {R"("23:59:59.123+02:00")", true}, {R"("00:00:00-11:30")", true},
      {R"("24:00:00Z")", false}, {R"("12:30:59")", false}, {R"("12:30Z")", false}}},
    {"format date-time", R"({"type": "string", "format": "date-time"})",
     {{R"("2024-05-06T07:08:09Z")", true}, {R"("2024-05-06T07:08:09.5Z")", true},
      {R"("2024-05-06 07:08:09Z")", false}, {R"("2024-05-06")", false}}},
    {"format uuid", R"({"type": "string", "format": "uuid"})",
     {{R"("123e4567-e89b-42d3-a456-426614174000")", true}, {R"("123e4567e89b42d3a456426614174000")", false},
      {R"("123e4567-e89b-42d3-a456-42661417400")", false}}},
    {"format email", R"({"type": "string", "format": "email"})",
     {{R"("ann.lee+x@mail.example.com")", true}, {R"("a_b@x.io")", true}, {R"("ann@")", false},
      {R"("@x.com")", false}, {R"("a..b@x.com")", false}, {R"(".a@x.com")", false}, {R"("a b@x.com")", false}}},
    {"zod's .email(): format and a pattern with lookaheads",
     R"({"type": "string", "format": "email",
         "pattern": "^(?!\\.)(?!.*\\.\\.)([A-Za-z0-9_'+\\-\\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$"})",
     {{R"("a.b@c.io")", true}, {R"("a..b@c.io")", false}, {R"("a.b@c")", false}}},
    {"zod's .uuid(): format and a pattern that compiles",
     R"({"type": "string", "format": "uuid",
         "pattern": "^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}|00000000-0000-0000-0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$"})",
     {{R"("123e4567-e89b-42d3-a456-426614174000")", true}, {R"("00000000-0000-0000-0000-000000000000")", true},
      {R"("123e4567-e89b-02d3-a456-426614174000")", false}}},
    {"zod 4's .email().max(13): pattern, format and maxLength (the pattern's strings of that length)",
     R"({"type": "string", "format": "email", "maxLength": 13, "minLength": 6,
         "pattern": "^(?:[A-Za-z0-9_'+\\-]+\\.)*[A-Za-z0-9_'+\\-]*[A-Za-z0-9_+-]@(?:[A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$"})",
     {{R"("a@b.io")", true}, {R"("ann.lee@x.io")", true}, {R"("ann.lee@xy.io")", true}, {R"("ann.lees@xy.io")", false},
      {R"("a@b.c")", false}, {R"("a@bio")", false}, {R"("a@b.i")", false}}},
    {"pattern with both lengths, unanchored", R"({"type": "string", "pattern": "ab", "minLength": 3, "maxLength": 4})",
     {{R"("xab")", true}, {R"("abyy")", true}, {R"("x\"ab")", true}, {R"("ab")", false}, {R"("xxabx")", false},
      {R"("xxxx")", false}}},
    {"pattern with maxLength: alternatives and an unbounded count", R"({"type": "string", "pattern": "^(a|bc)+$", "maxLength": 3})",
     {{R"("a")", true}, {R"("bca")", true}, {R"("aaa")", true}, {R"("abc")", true}, {R"("abca")", false}, {R"("")", false},
      {R"("b")", false}}},
    // ----------------------------------------------------------------- unions, merges, references
    {"oneOf with disjoint alternatives", R"({"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})",
     {{"1", true}, {R"("a")", true}, {R"("ab")", false}, {"1.5", false}, {"null", false}}},
    {"allOf of objects merged",
     R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                   {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})",
     {{R"({"a": 1, "b": "x"})", true}, {R"({"a": 1})", false}, {R"({"b": "x"})", false}, {R"({"a": "1", "b": "x"})", false}}},
    {"allOf: tighter bounds", R"({"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 9}, {"minimum": 2}]})",
     {{"2", true}, {"9", true}, {"10", false}, {"1", false}}},
    {"allOf: a closed part drops the others' optional properties",
     R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": false},
                   {"properties": {"b": {"type": "integer"}}}]})",
     {{R"({"a": 1})", true}, {"{}", true}, {R"({"a": 1, "b": 2})", false}}},
    {"allOf: one property in two parts", R"({"type": "object", "required": ["n"],
        "allOf": [{"properties": {"n": {"type": "integer", "minimum": 1}}}, {"properties": {"n": {"maximum": 3}}}]})",
     {{R"({"n": 1})", true}, {R"({"n": 3})", true}, {R"({"n": 4})", false}, {R"({"n": 0})", false}}},
    {"$ref beside another keyword", R"({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "minimum": 5})",
     {{"5", true}, {"50", true}, {"4", false}, {"5.5", false}}},
    {"recursive $ref through $defs", R"({"$defs": {"node": {"type": "object", "properties": {
         "v": {"type": "integer", "minimum": 0}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
         "required": ["v", "next"], "additionalProperties": false}}, "$ref": "#/$defs/node"})",
     {{R"({"v": 1, "next": {"v": 2, "next": null}})", true}, {R"({"v": 1, "next": {"v": -2, "next": null}})", false},
      {R"({"v": 1})", false}}},
    // ----------------------------------------------------------------- arrays, records
    {"prefixItems, no more items", R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
                                       "items": false})",
     {{R"(["a", 1])", true}, {R"([1, "a"])", false}, {R"(["a", 1, 2])", false}}},
    {"prefixItems then items", R"({"type": "array", "prefixItems": [{"const": "x"}], "items": {"type": "integer"},
                                   "maxItems": 3})",
     {{R"(["x"])", true}, {R"(["x", 1])", true}, {R"(["x", 1, 2])", true}, {R"(["x", 1, 2, 3])", false},
      {R"(["x", "y"])", false}, {R"(["y"])", false}}},
    {"prefixItems and minItems beyond them", R"({"type": "array", "prefixItems": [{"type": "null"}],
                                                 "items": {"type": "boolean"}, "minItems": 3})",
     {{"[null, true, false]", true}, {"[null, true, false, true]", true}, {"[null, true]", false}}},
    {"draft 7 items array and additionalItems", R"({"type": "array", "items": [{"type": "boolean"}],
                                                    "additionalItems": false})",
     {{"[true]", true}, {"[true, false]", false}, {"[1]", false}}},
    {"zod's record: propertyNames and additionalProperties",
     R"({"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {"type": "number"}})",
     {{R"({"k": 1.5})", true}, {"{}", true}, {R"({"k": "x"})", false}}},
    {"unicode keys and enum values", R"({"type": "object", "properties": {"clé": {"enum": ["été", "∑"]}},
                                         "required": ["clé"], "additionalProperties": false})",
     {{R"({"clé": "été"})", true}, {R"({"clé": "∑"})", true}, {R"({"cle": "été"})", false}}},
};

}  // namespace

TEST_CASE("schema cases: the validator agrees with the marks, the grammar accepts exactly the valid ones") {
  for (const Case& c : kCases) {
    const std::string description = c.description;
    CAPTURE(description);
    const auto g = schema_grammar(c.schema);
    const test::SchemaValidator validator(json::parse(c.schema));
    for (const Instance& t : c.tests) {
      const std::string text = t.text;
      CAPTURE(text);
      const json v = json::parse(t.text, nullptr, false);
      if (!v.is_discarded()) CHECK(validator.check(v).empty() == t.valid);
      else CHECK_FALSE(t.valid);
      CHECK(accepts(g, t.text) == t.valid);
    }
  }
}

TEST_CASE("what the grammar does not generate although valid") {
  const auto obj = schema_grammar(R"({"type": "object", "properties": {"a": {"type": "integer"},
                                      "b": {"type": "integer"}}, "required": ["a", "b"]})");
  CHECK(accepts(obj, R"({"a": 1, "b": 2})"));
  CHECK_FALSE(accepts(obj, R"({"b": 2, "a": 1})"));          // schema order only
  CHECK_FALSE(accepts(obj, R"({"a": 1, "b": 2, "c": 3})"));  // no undeclared properties
  CHECK_FALSE(accepts(obj, R"({"a":   1, "b": 2})"));        // one whitespace run only
  const auto num = schema_grammar(R"({"type": "integer"})");
  CHECK_FALSE(accepts(num, "12345678901234567"));  // 17 digits
  CHECK_FALSE(accepts(num, "1.0"));
  const auto bounded = schema_grammar(R"({"type": "integer", "minimum": -5, "maximum": 123})");
  CHECK_FALSE(accepts(bounded, "-0"));
  const auto unit = schema_grammar(R"({"type": "number", "minimum": 0.5, "maximum": 1})");
  CHECK(accepts(unit, "1"));
  CHECK_FALSE(accepts(unit, "0.75"));  // a fraction in a partial unit interval
  CHECK_FALSE(accepts(unit, "1.0"));   // its unit interval [1, 2) is not inside the bounds
  CHECK_FALSE(accepts(schema_grammar(R"({"type": "number", "minimum": 0})"), "1e2"));  // no exponent when bounded
  CHECK_FALSE(accepts(schema_grammar(R"({"type": "string", "format": "date"})"), R"("2024-02-29")"));  // Feb <= 28
  CHECK_FALSE(accepts(schema_grammar(R"({"type": "string", "format": "date-time"})"), R"("2024-05-06T07:08:09+01:00")"));
  CHECK_FALSE(accepts(schema_grammar(R"({"type": "string", "format": "uuid"})"), R"("123E4567-E89B-42D3-A456-426614174000")"));
  CHECK_FALSE(accepts(schema_grammar(R"({"type": "array", "prefixItems": [{"type": "null"}, {"type": "null"}]})"),
                      "[null]"));  // every prefix item is written
  const auto with_control = schema_grammar(R"({"type": "string", "pattern": "^[a\\x01]$"})");
  CHECK(accepts(with_control, R"("a")"));
  CHECK_FALSE(accepts(with_control, R"("\u0001")"));  // control characters other than \t \n \r: never written
  const auto str = schema_grammar(R"({"type": "string"})");
  CHECK_FALSE(accepts(str, R"("\ud83d\ude00")"));  // a surrogate pair as escapes
  CHECK(accepts(str, "\"\xF0\x9F\x98\x80\""));      // the same character as UTF-8
  CHECK(accepts(schema_grammar(R"({"type": "object"})"), "{\n\t\"a\": 1\n}"));
  CHECK_FALSE(accepts(schema_grammar(R"({"type": "object"})"), " {}"));  // no leading whitespace
}

TEST_CASE("zod's .email().max(n) grows linearly with n: one rule per automaton state and length") {
  auto rules_for = [](int n) {
    const std::string schema = R"({"type": "string", "format": "email", "maxLength": )" + std::to_string(n) +
                               R"(, "pattern": "^(?:[A-Za-z0-9_'+\\-]+\\.)*[A-Za-z0-9_'+\\-]*[A-Za-z0-9_+-]@(?:[A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$"})";
    return schema_grammar(schema)->rules().size();
  };
  const size_t r128 = rules_for(128), r255 = rules_for(255);
  MESSAGE("zod .email().max(128): " << r128 << " rules; .max(255): " << r255);
  CHECK(r255 < 30 * 256);       // at most one per state (30) and length
  CHECK(r255 * 10 < r128 * 21);  // about twice for twice the length
  CHECK(r255 > r128);
}

TEST_CASE("zod's .int() bounds are cheap: a digit-range grammar of a few rules") {
  const std::string zod_int = R"({"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991})";
  auto gbnf = json_schema_to_gbnf(zod_int);
  REQUIRE(gbnf.ok());
  const auto g = schema_grammar(zod_int);
  const auto plain = schema_grammar(R"({"type": "integer"})");
  MESSAGE("zod .int(): " << gbnf->size() << " bytes of GBNF, " << g->rules().size() << " rules, " << g->elements().size()
                         << " elements (plain integer: " << plain->rules().size() << " rules, " << plain->elements().size()
                         << " elements)");
  CHECK(gbnf->size() < 2000);
  CHECK(g->elements().size() < 20 * plain->elements().size());
  // Every digit count is reachable: the smallest and largest of each length within the bound.
  for (int digits = 1; digits <= 16; ++digits) {
    const std::string lo = digits == 1 ? "0" : "1" + std::string(size_t(digits - 1), '0');
    const std::string hi = digits == 16 ? "9007199254740991" : std::string(size_t(digits), '9');
    CAPTURE(digits);
    CHECK(accepts(g, lo));
    CHECK(accepts(g, hi));
    CHECK(accepts(g, "-" + hi));
  }
}

TEST_CASE("json_object grammar: any object") {
  auto g = Grammar::parse(json_object_gbnf());
  REQUIRE(g.ok());
  CHECK(accepts(*g, R"({"a": {"b": [1, -2.5e3, "x\u0041", null, false]}})"));
  CHECK(accepts(*g, "{}"));
  CHECK_FALSE(accepts(*g, "[]"));
  CHECK_FALSE(accepts(*g, "\"s\""));
  CHECK_FALSE(accepts(*g, R"({"a" 1})"));
  CHECK_FALSE(accepts(*g, R"({'a': 1})"));
}

TEST_CASE("unsupported or broken schemas are errors that say what and where") {
  auto err = [](const std::string& schema) {
    auto r = json_schema_to_gbnf(schema);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().is_invalid_argument());
    return r.error();
  };
  CHECK(err(R"({"type": "string", "not": {"const": "a"}})") == "JSON schema: unsupported keyword 'not' at #");
  CHECK(err(R"({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}})") ==
        "JSON schema: unsupported keyword 'multipleOf' at #/properties/n");
  CHECK(err(R"({"if": {}, "then": {}})").find("'if'") != std::string::npos);
  CHECK(err(R"({"type": "object", "patternProperties": {"^a": {}}})").find("'patternProperties'") != std::string::npos);
  CHECK(err(R"({"type": "object", "propertyNames": {"maxLength": 3}})").find("'propertyNames'") != std::string::npos);
  CHECK(err(R"({"type": "string", "format": "uri"})") ==
        "JSON schema: unsupported keyword 'format' at # (format 'uri' is not supported (date, time, date-time, uuid, "
        "email are))");
  CHECK(err(R"({"type": "string", "pattern": "^(?!a)b$"})").find("lookaround '(?!'") != std::string::npos);
  CHECK(err(R"({"type": "string", "pattern": "^(a)\\1$"})").find("backreference") != std::string::npos);
  CHECK(err(R"({"type": "string", "pattern": "^a\\bc$"})").find("word boundary") != std::string::npos);
  CHECK(err(R"({"type": "string", "pattern": "^\\p{L}$"})").find("Unicode property") != std::string::npos);
  CHECK(err(R"({"type": "string", "pattern": "^(ab$"})").find("missing ')'") != std::string::npos);
  CHECK(err(R"({"type": "string", "pattern": "^a**$"})").find("quantifier after a quantifier") != std::string::npos);
  CHECK(err(R"({"type": "string", "pattern": "^a{3}$", "maxLength": 2})").find("no string of 0 to 2") != std::string::npos);
  CHECK(err(R"({"type": "string", "format": "email", "maxLength": 20})").find("beside format") != std::string::npos);
  CHECK(err(R"({"type": "string", "pattern": "^a+$", "minLength": 2})").find("without maxLength") != std::string::npos);
  CHECK(err(R"({"type": "string", "pattern": "^[a-z]+$", "maxLength": 100000})").find("20000") != std::string::npos);
  CHECK(err(R"({"type": "integer", "minimum": 5, "maximum": 4})").find("no integer in [5, 4]") != std::string::npos);
  CHECK(err(R"({"type": "integer", "minimum": 1e17})").find("16 integer digits") != std::string::npos);
  CHECK(err(R"({"type": "number", "minimum": 0.1, "maximum": 0.9})").find("no number") != std::string::npos);
  CHECK(err(R"({"type": "integer", "minimum": "1"})").find("minimum must be a number") != std::string::npos);
  CHECK(err(R"({"allOf": [{"type": "string"}, {"type": "integer"}]})").find("no type in common") != std::string::npos);
  CHECK(err(R"({"allOf": [{"const": 1}, {"const": 2}]})").find("different values in allOf") != std::string::npos);
  CHECK(err(R"({"allOf": [{"properties": {"a": {}}, "additionalProperties": false},
                          {"properties": {"b": {}}, "required": ["b"]}]})").find("excluded") != std::string::npos);
  CHECK(err(R"({"type": "array", "uniqueItems": true})").find("'uniqueItems'") != std::string::npos);
  CHECK(err(R"({"type": "array", "additionalItems": false})").find("'additionalItems'") != std::string::npos);
  CHECK(err(R"({"type": "array", "prefixItems": [{}], "items": false, "minItems": 2})").find("minItems above") !=
        std::string::npos);
  CHECK(err(R"({"anyOf": [{"type": "string"}], "maxLength": 2})").find("beside anyOf") != std::string::npos);
  CHECK(err(R"({"enum": ["a"], "maxLength": 2})").find("beside enum") != std::string::npos);
  CHECK(err(R"({"$ref": "#/$defs/missing"})").find("does not resolve") != std::string::npos);
  CHECK(err(R"({"$ref": "other.json#/a"})").find("'$ref'") != std::string::npos);
  CHECK(err(R"({"type": "strin"})").find("unknown type 'strin'") != std::string::npos);
  CHECK(err(R"({"type": "string", "maxLength": -1})").find("non-negative integer") != std::string::npos);
  CHECK(err(R"({"type": "string", "minLength": 3, "maxLength": 2})").find("below") != std::string::npos);
  CHECK(err(R"({"type": "string", "maxLength": 99999999})").find("above the limit") != std::string::npos);
  CHECK(err(R"({"enum": [1], "type": "string"})").find("no enum value") != std::string::npos);
  CHECK(err(R"({"type": "object", "required": ["x"], "additionalProperties": false})").find("excluded") !=
        std::string::npos);
  CHECK(err("false").find("allows no value") != std::string::npos);
  CHECK(err("{not json").find("not valid JSON") != std::string::npos);
  // A schema that is only a reference to itself (also as the first of a union) would compile to a
  // left-recursive grammar; one that requires itself has no finite instance. Both are the client's error.
  for (const char* schema :
       {R"({"$ref": "#"})", R"({"anyOf": [{"$ref": "#"}, {"type": "null"}]})",
        R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"}) {
    const std::string text = schema;
    CAPTURE(text);
    CHECK(err(schema).find("comes back to itself before any character") != std::string::npos);
  }
  CHECK(err(R"({"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]})")
            .find("no finite value") != std::string::npos);
  // Recursion behind a character is fine: a linked list.
  auto list = json_schema_to_gbnf(
      R"({"type": "object", "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["v", "next"]})");
  REQUIRE(list.ok());
  CHECK(Grammar::parse(*list).ok());
  std::string deep = "true";
  for (int i = 0; i < 100; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  CHECK(err(deep).find("nested deeper") != std::string::npos);
}

TEST_CASE("malformed patterns and self-referring merges are errors, never crashes or broken grammars") {
  const char* const patterns[] = {"(", ")", "[", "]", "\\", "a{", "{1}", "[z-a]", "(?", "(?<n", "a|*", "^*", "a{2,1}",
                                  "a{99999999}", "[\\d-z]", "\\u12", "\\x", "()", "(|)", "^$", "$", "^", "[^\\s\\S]",
                                  "a\\"};
  for (const char* p : patterns) {
    const std::string pattern = p;
    CAPTURE(pattern);
    auto r = json_schema_to_gbnf(json({{"type", "string"}, {"pattern", pattern}}).dump());
    if (r.ok()) CHECK_MESSAGE(Grammar::parse(*r).ok(), *r);
    else CHECK(r.status().is_invalid_argument());
  }
  for (const char* schema : {R"({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"})",
                             R"({"$ref": "#", "minimum": 1})", R"({"allOf": []})", R"({"allOf": [false]})",
                             R"({"allOf": [{"$ref": "#/nope"}]})"}) {
    const std::string text = schema;
    CAPTURE(text);
    auto r = json_schema_to_gbnf(schema);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().is_invalid_argument());
  }
}

TEST_CASE("a builder holds several schemas with their own $ref scopes") {
  JsonGrammarBuilder b;
  auto a = b.add_schema(R"({"$defs": {"x": {"type": "integer"}}, "$ref": "#/$defs/x"})", "a");
  auto s = b.add_schema(R"({"$defs": {"x": {"type": "string"}}, "$ref": "#/$defs/x"})", "b");
  REQUIRE(a.ok());
  REQUIRE(s.ok());
  auto g = Grammar::parse(b.gbnf(*a + " \" \" " + *s));
  REQUIRE_MESSAGE(g.ok(), g.error());
  CHECK(accepts(*g, R"(1 "x")"));
  CHECK_FALSE(accepts(*g, R"("x" 1)"));
}

// ------------------------------------------------------------------------------- sampling under masks

namespace {

// The five schemas of the end-to-end check (bounded so that random generation finishes).
const char* const kSampleSchemas[] = {
    R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}},
        "required": ["name", "age", "tags"], "additionalProperties": false})",
    R"({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
        "size": {"anyOf": [{"type": "number"}, {"type": "null"}]}, "ok": {"type": "boolean"}, "v": {"const": "x1"}},
        "required": ["color", "size", "ok", "v"], "additionalProperties": false})",
    R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": ["string", "null"], "maxLength": 5},
        "c": {"type": "boolean"}}, "required": ["b"], "additionalProperties": false})",
    R"({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
        "required": ["x", "y"], "additionalProperties": false}}, "type": "object",
        "properties": {"points": {"type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 1, "maxItems": 3}},
        "required": ["points"], "additionalProperties": false})",
    R"({"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 8}, "minItems": 2, "maxItems": 4})",
};

// Issue 23's keywords, as zod 4 writes them, bounded likewise.
const char* const kKeywordSchemas[] = {
    R"({"type": "object", "properties": {"id": {"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991},
        "email": {"type": "string", "format": "email"}, "when": {"type": "string", "format": "date-time"},
        "uid": {"type": "string", "format": "uuid"}, "score": {"type": "number", "minimum": 0, "maximum": 1},
        "pos": {"type": "number", "exclusiveMinimum": 0}},
        "required": ["id", "email", "when", "uid", "score", "pos"], "additionalProperties": false})",
    R"({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}(\\.[a-z]{1,3})?$"},
        "kind": {"oneOf": [
          {"type": "object", "properties": {"t": {"const": "a"}, "n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}},
           "required": ["t", "n"], "additionalProperties": false},
          {"type": "object", "properties": {"t": {"const": "b"}, "s": {"type": "string", "maxLength": 5}},
           "required": ["t", "s"], "additionalProperties": false}]},
        "day": {"type": "string", "format": "date"}, "at": {"type": "string", "format": "time"}},
        "required": ["code", "kind", "day", "at"], "additionalProperties": false})",
    R"({"$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999}},
        "required": ["id"]}}, "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"tags": {"type": "array",
        "prefixItems": [{"type": "string", "maxLength": 3}, {"type": "boolean"}], "items": false},
        "t": {"type": ["number", "null"], "maximum": -2.5}}, "required": ["tags", "t"]}]})",
    R"({"type": "array", "prefixItems": [{"type": "string", "format": "uuid"}],
        "items": {"type": "number", "exclusiveMinimum": 0, "maximum": 100}, "maxItems": 4})",
    R"({"type": "object", "properties": {"email": {"type": "string", "format": "email", "maxLength": 24,
        "pattern": "^(?:[A-Za-z0-9_'+\\-]+\\.)*[A-Za-z0-9_'+\\-]*[A-Za-z0-9_+-]@(?:[A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$"},
        "code": {"type": "string", "pattern": "[0-9]", "minLength": 2, "maxLength": 5}},
        "required": ["email", "code"], "additionalProperties": false})",
};

void check_sampling(const Tokenizer& tok, int per_schema, int max_tokens, std::span<const char* const> schemas) {
  const auto trie = TokenTrie::from_tokenizer(tok);
  int complete = 0, total = 0;
  for (const char* schema : schemas) {
    const std::string schema_text = schema;
    CAPTURE(schema_text);
    auto automaton = std::make_shared<GrammarAutomaton>(schema_grammar(schema), trie);
    const test::SchemaValidator validator(json::parse(schema));
    for (int i = 0; i < per_schema; ++i) {
      const test::Sampled s = test::sample_random(tok, automaton, 1000 + uint64_t(i), max_tokens);
      ++total;
      if (!s.complete) continue;
      ++complete;
      CAPTURE(s.text);
      const json v = json::parse(s.text, nullptr, false);
      REQUIRE_FALSE(v.is_discarded());
      CHECK(validator.check(v) == "");
    }
  }
  MESSAGE(tok.kind() << ": " << complete << "/" << total << " random generations completed, all valid");
  CHECK(complete * 10 >= total * 9);  // bounded schemas: nearly all finish within max_tokens
}

}  // namespace

TEST_CASE("random sampling under the mask, stories260K vocabulary: every completed output validates") {
  const Tokenizer* tok = test::shared_gguf_vocab("models/stories260K.gguf");
  if (!tok) return;
  check_sampling(*tok, 40, 2000, kSampleSchemas);
}

TEST_CASE("random sampling under the mask, issue 23's keywords (bounds, formats, patterns, unions, allOf, tuples)") {
  const Tokenizer* tok = test::shared_gguf_vocab("models/stories260K.gguf");
  if (!tok) return;
  check_sampling(*tok, 40, 2000, kKeywordSchemas);
  const Tokenizer* llama3 = test::shared_hf_vocab("tokenizers/llama3.tokenizer.json", "llama-bpe", "test_json_schema");
  if (!llama3) return;
  check_sampling(*llama3, 8, 1000, kKeywordSchemas);
}

TEST_CASE("random sampling under the mask, Llama 3 vocabulary: every completed output validates") {
  const Tokenizer* tok = test::shared_hf_vocab("tokenizers/llama3.tokenizer.json", "llama-bpe", "test_json_schema");
  if (!tok) return;
  check_sampling(*tok, 8, 1000, kSampleSchemas);
}

// The issue's acceptance check at engine level: 100 replies per schema sampled at temperature 1 (seeds
// 0..99) from the real stories260K forward pass under the grammar, every one complete and valid. The
// schemas bound every string and array, so each reply fits max_tokens.
TEST_CASE("stories260K: 100 sampled replies per schema under the grammar all validate") {
  auto model = test::load_shared("models/stories260K.gguf");
  if (!model) return;
  const Tokenizer& tok = model->tokenizer();
  const auto trie = TokenTrie::from_tokenizer(tok);
  const std::vector<int32_t> prompt = tok.encode("Once upon a time", true, false);
  ThreadPool pool(1);
  Forward forward(*model, pool);
  constexpr int kReplies = 100, kMaxTokens = 480;
  int valid = 0, total = 0, tokens = 0;
  double seconds = 0;
  for (const char* schema : kSampleSchemas) {
    const std::string schema_text = schema;
    CAPTURE(schema_text);
    auto automaton = std::make_shared<GrammarAutomaton>(schema_grammar(schema), trie);
    const test::SchemaValidator validator(json::parse(schema));
    for (int seed = 0; seed < kReplies; ++seed) {
      GrammarConstraint constraint(automaton);
      GenerateOptions o;
      o.max_tokens = kMaxTokens;
      o.sampling.temperature = 1.0f;
      o.sampling.seed = uint64_t(seed);
      o.constraint = &constraint;
      DenseKvCache cache(model->config(), int32_t(prompt.size()) + kMaxTokens + 1);
      std::string text;
      auto r = generate(forward, cache, tok, prompt, o, [&](std::string_view t) {
        text += t;
        return true;
      });
      REQUIRE_MESSAGE(r.ok(), r.error());
      ++total;
      tokens += int(r->tokens.size());
      seconds += r->decode_seconds;
      CAPTURE(seed);
      CAPTURE(text);
      CHECK(r->finish_reason == FinishReason::Eos);
      const json v = json::parse(text, nullptr, false);
      REQUIRE_FALSE(v.is_discarded());
      const std::string why = validator.check(v);
      CHECK(why == "");
      valid += why.empty() && r->finish_reason == FinishReason::Eos;
      if (seed == 0) MESSAGE("seed 0: " << text);
    }
  }
  MESSAGE(valid << "/" << total << " replies valid; " << tokens << " tokens in " << seconds << " s decode");
  CHECK(valid == total);
}
