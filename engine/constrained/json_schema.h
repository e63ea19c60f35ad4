// JSON Schema → GBNF (engine/constrained/grammar.h): grammars whose every sentence is a JSON text valid against
// the schema, for OpenAI-style structured output (response_format json_schema / json_object) and tool
// call arguments.
//
// Supported (what llama.cpp's json-schema-to-grammar supports; docs/grammar.md has the table):
//   type (one name or an array of them): object, array, string, number, integer, boolean, null
//   object: properties, required, additionalProperties (false; true or a schema alongside
//           properties generates the declared properties only, which still validates; with no
//           properties a schema gives objects whose every value is of that schema),
//           propertyNames {"type": "string"} (zod's records)
//   array:  items (one schema), prefixItems (or draft 7's items array with additionalItems),
//           minItems, maxItems
//   string: minLength, maxLength (in code points, escapes counting as one), pattern (a regex subset),
//           format (date, time, date-time, uuid, email): engine/constrained/json_schema_leaves.h
//   integer, number: minimum, maximum, exclusiveMinimum, exclusiveMaximum (digit-range grammars;
//           numbers: see json_schema_leaves.h for the fractions written)
//   enum, const, anyOf, oneOf (as anyOf: its alternatives should be disjoint), allOf (merged into one
//   schema), $ref to "#", "#/$defs/...", "#/definitions/..." (any local JSON pointer; beside other
//   keywords it is merged like allOf), boolean schemas (true: any value; false: an error)
//   annotations, ignored: title, description, default, examples, $schema, $id, $comment,
//   deprecated, readOnly, writeOnly; uniqueItems: false
// Anything else (not, if/then/else, multipleOf, patternProperties, uniqueItems: true, ...) is an
// InvalidArgument naming the keyword and where it is: never silently dropped.
//
// What the grammar generates, a subset of the valid instances chosen so that generation cannot run
// away and parsers agree on the value:
//   - properties appear in the schema's order (optional ones may be left out); no duplicate keys;
//   - whitespace between tokens is at most one run of " " or "\n" followed by up to 20 spaces/tabs;
//   - integers have at most 16 digits (so they fit int64), fractions at most 15 digits, exponents at
//     most 2 digits; strings use \uXXXX escapes only for non-surrogates (a pair would count as two
//     characters against maxLength), and never raw control characters;
//   - a schema without "type" takes its type from its keywords (properties → object, items → array,
//     minLength → string), else any JSON value.
// Unbounded strings and arrays stay unbounded: the caller's max_tokens ends a runaway generation.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/base/status.h"

namespace towers {

// Accumulates GBNF rules: schemas (each with its own $ref scope), the generic JSON rules, and rules
// written by the caller, then gives the whole grammar text.
class JsonGrammarBuilder {
 public:
  JsonGrammarBuilder();
  ~JsonGrammarBuilder();

  // Rules for values valid against `schema_json`; returns the name of the rule that matches them.
  // `name` is a hint for the generated rule names (letters, digits, '-').
  Result<std::string> add_schema(std::string_view schema_json, std::string_view name);
  // Generic rules: any JSON value / object / string, and "ws" (the bounded whitespace run).
  std::string any_value();
  std::string any_object();
  std::string any_string();
  std::string ws();
  // name ::= body, verbatim GBNF; returns the name actually used (made unique).
  std::string add_rule(std::string_view name, std::string_view body);

  // All rules so far, `root ::= root_body` first.
  std::string gbnf(std::string_view root_body) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The grammar of values valid against a schema (root rule "root").
Result<std::string> json_schema_to_gbnf(std::string_view schema_json);
// Any JSON object (response_format {"type": "json_object"}).
std::string json_object_gbnf();

}  // namespace towers
