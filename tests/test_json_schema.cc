// JSON Schema → grammar: JSON-Schema-Test-Suite-style cases (each instance fed as bytes must be
// accepted exactly when it is valid; the independent validator of json_schema_validator.h agrees on
// every case first), errors naming unsupported keywords, and sampling under token masks (random
// logits, seeded) on real vocabularies: every completed output parses and validates.
#include <random>

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
  const auto str = schema_grammar(R"({"type": "string"})");
  CHECK_FALSE(accepts(str, R"("\ud83d\ude00")"));  // a surrogate pair as escapes
  CHECK(accepts(str, "\"\xF0\x9F\x98\x80\""));      // the same character as UTF-8
  CHECK(accepts(schema_grammar(R"({"type": "object"})"), "{\n\t\"a\": 1\n}"));
  CHECK_FALSE(accepts(schema_grammar(R"({"type": "object"})"), " {}"));  // no leading whitespace
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
  CHECK(err(R"({"type": "string", "pattern": "^a"})") == "JSON schema: unsupported keyword 'pattern' at #");
  CHECK(err(R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}})") ==
        "JSON schema: unsupported keyword 'minimum' at #/properties/n");
  CHECK(err(R"({"oneOf": [{"type": "string"}]})").find("'oneOf'") != std::string::npos);
  CHECK(err(R"({"allOf": [{"type": "string"}]})").find("'allOf'") != std::string::npos);
  CHECK(err(R"({"type": "string", "format": "date"})").find("'format'") != std::string::npos);
  CHECK(err(R"({"type": "array", "prefixItems": []})").find("'prefixItems'") != std::string::npos);
  CHECK(err(R"({"type": "array", "items": [{"type": "string"}]})").find("tuple") != std::string::npos);
  CHECK(err(R"({"type": "array", "uniqueItems": true})").find("'uniqueItems'") != std::string::npos);
  CHECK(err(R"({"$ref": "#/$defs/a", "type": "string", "$defs": {"a": {}}})").find("beside $ref") !=
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
  // A schema that is only a reference to itself compiles to a left-recursive grammar.
  auto loop = json_schema_to_gbnf(R"({"$ref": "#"})");
  REQUIRE(loop.ok());
  CHECK(Grammar::parse(*loop).error().find("left recursion") != std::string::npos);
  // A schema that only refers to itself has no finite instance: the grammar compiler says so.
  auto self = json_schema_to_gbnf(R"({"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]})");
  REQUIRE(self.ok());
  auto g = Grammar::parse(*self);
  REQUIRE_FALSE(g.ok());
  CHECK(g.error().find("can never finish") != std::string::npos);
  std::string deep = "true";
  for (int i = 0; i < 100; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  CHECK(err(deep).find("nested deeper") != std::string::npos);
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

void check_sampling(const Tokenizer& tok, int per_schema, int max_tokens) {
  const auto trie = TokenTrie::from_tokenizer(tok);
  int complete = 0, total = 0;
  for (const char* schema : kSampleSchemas) {
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
  check_sampling(*tok, 40, 2000);
}

TEST_CASE("random sampling under the mask, Llama 3 vocabulary: every completed output validates") {
  const Tokenizer* tok = test::shared_hf_vocab("tokenizers/llama3.tokenizer.json", "llama-bpe", "test_json_schema");
  if (!tok) return;
  check_sampling(*tok, 8, 1000);
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
