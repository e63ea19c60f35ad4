// GBNF for JSON Schema's leaf assertions, used by engine/constrained/json_schema.cc: numbers within
// bounds (minimum / maximum / exclusiveMinimum / exclusiveMaximum) as digit-range grammars, string
// `pattern`s (a regular-expression subset) and string `format`s. Every function returns a GBNF
// expression (no rule definitions), or InvalidArgument saying what it cannot express.
//
// The written texts are a subset of the valid ones, as everywhere in the JSON grammars:
//   - integers have at most kMaxIntegerDigits digits and no "-0"; every integer within the bounds
//     (and within that many digits) can be written, nothing else;
//   - bounded numbers: an integer within the bounds, or a fraction I.F (no exponent) whose whole unit
//     interval [I, I+1) (negative: (-(I+1), -I]) lies within the bounds; an exclusive integer bound
//     also allows the fractions just past it (exclusiveMinimum 0: 0.5). Fractions in a partial unit
//     interval at a non-integer bound (minimum 0.5: 0.75) are not written;
//   - a pattern's strings are written with JSON's shortest escapes (\" \\ \n \r \t); other control
//     characters are never written;
//   - formats: see format_gbnf().
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "engine/base/status.h"

namespace towers {

constexpr int kMaxIntegerDigits = 16;  // every such integer fits int64 (and 2^53-1 has 16 digits)

// One side of a numeric interval: the bound's value and whether it is exclusive.
struct NumberBound {
  double value = 0;
  bool exclusive = false;
  // A bound that is an exact integer in JSON (kept exactly; a double rounds above 2^53).
  std::optional<int64_t> integer;
};

// Decimal integers n (optional "-", no leading zeros) with lo <= n <= hi; nullopt: unbounded.
Result<std::string> integer_range_gbnf(const std::optional<NumberBound>& lo, const std::optional<NumberBound>& hi);
// JSON numbers within the bounds, as described above.
Result<std::string> number_range_gbnf(const std::optional<NumberBound>& lo, const std::optional<NumberBound>& hi);

// The content (between the quotes) of JSON strings whose value matches `pattern`, an ECMAScript regular
// expression in this subset: literals and escapes (\n \t \xHH \uHHHH \. ...), classes ([a-z], [^...],
// \d \w \s \D \W \S, '.'), groups ( ... ), (?: ... ), (?<name> ... ), alternation |, quantifiers ? * +
// {m} {m,} {m,n} (a lazy '?' after one changes nothing here), '^' at the start and '$' at the end (a
// pattern without them matches anywhere in the string, as JSON Schema says). Lookarounds,
// backreferences, word boundaries and Unicode property classes are errors that name them.
Result<std::string> pattern_gbnf(std::string_view pattern);

// The same strings, of min_length to max_length code points (a pattern's strings intersected with
// minLength/maxLength, as zod's `.email().max(n)` writes them). They need rules: one per state of the
// pattern's automaton and length so far, each given to `define` (which returns its name, and may
// return an earlier rule with the same body) after the rules it names. Returns the expression of the
// content; InvalidArgument for a pattern pattern_gbnf refuses, no string of those lengths, or more
// than 20000 (state, length) pairs.
Result<std::string> bounded_pattern_gbnf(std::string_view pattern, size_t min_length, size_t max_length,
                                         const std::function<std::string(std::string body)>& define);

// The content of JSON strings of a format: "date" (YYYY-MM-DD, days within their month, February up
// to 28), "time" (HH:MM:SS with optional fraction and a "Z" or ±HH:MM offset), "date-time" (date "T"
// time with "Z": no offset, so that it also matches patterns that require UTC), "uuid" (lower-case,
// version 1-8, RFC variant), "email" (dot-separated atoms of [A-Za-z0-9_+-] "@" domain labels, a
// letters-only top-level label). An unknown format is an error naming it.
Result<std::string> format_gbnf(std::string_view format);

}  // namespace towers
