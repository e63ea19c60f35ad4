// Context-free grammars for constrained decoding, written in GBNF (llama.cpp's grammar notation) and
// compiled to rules over BYTES, so that a token's bytes can be matched without caring where UTF-8
// characters start or end (byte-fallback tokens such as <0xE2> are ordinary bytes here).
//
// GBNF as accepted here:
//   root    ::= "{" ws pair ( "," ws pair )* "}"     # a rule: name ::= alternatives
//   name    ::= [a-zA-Z_] [a-zA-Z0-9_-]*             # rules may span lines; '#' starts a comment
//   - "literal"    code points, escapes \n \r \t \\ \" \' \[ \] \- \/ \xHH \uHHHH \UHHHHHHHH
//   - [a-z0-9_]    a class of code points; [^...] its complement (over all Unicode scalar values:
//                  surrogates are never matched); '.' is any code point
//   - ( ... )      grouping; a | b alternatives; an empty alternative matches the empty string
//   - x* x+ x?     repetition; x{m} x{m,} x{m,n} bounded repetition (n <= kMaxRepeat)
// Code points are matched as their UTF-8 encoding, so only valid UTF-8 is ever accepted.
//
// Compilation rejects: undefined rules, a missing root, left recursion (direct or through rules that
// can match the empty string: the matcher would expand it for ever), grammars whose root cannot match
// any finite string, groups nested deeper than kMaxGroupDepth, and grammars larger than kMaxElements.
// Alternatives that can never finish (they reference a rule with no finite derivation) are dropped, so
// every prefix the matcher accepts can be completed.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/base/status.h"

namespace towers {

class Grammar {
 public:
  static constexpr int kMaxRepeat = 100000;        // n in x{m,n}
  static constexpr size_t kMaxElements = 1 << 22;  // compiled grammar size limit
  static constexpr int kMaxGroupDepth = 256;       // ( ( ... ) ) nested at most this deep

  // Parses and compiles `gbnf`; `root` names the start rule.
  static Result<std::shared_ptr<const Grammar>> parse(std::string_view gbnf, std::string_view root = "root");

  // The compiled form, read by the matcher (engine/constrained/grammar_matcher.h). The rules are flattened into
  // one array of elements: every alternative is a run of Byte/Ref elements closed by End.
  enum class Kind : uint8_t { End, Byte, Ref };
  struct Element {
    Kind kind;
    uint32_t arg;  // Byte: index into byte_sets(); Ref: rule index
  };
  using ByteSet = std::array<uint64_t, 4>;  // bit b: byte b matches
  struct Rule {
    std::string name;                 // generated rules are named after their parent ("value-3")
    std::vector<uint32_t> alternatives;  // element index where each alternative starts
  };

  const std::vector<Element>& elements() const { return elements_; }
  const std::vector<ByteSet>& byte_sets() const { return byte_sets_; }
  const std::vector<Rule>& rules() const { return rules_; }
  uint32_t root() const { return root_; }
  static bool contains(const ByteSet& s, uint8_t b) { return (s[b >> 6] >> (b & 63)) & 1; }

  // The compiled rules in GBNF-like text, byte sets as [\x00-\x1f...] (for debugging and docs).
  std::string dump() const;

 private:
  friend class GrammarCompiler;
  std::vector<Element> elements_;
  std::vector<ByteSet> byte_sets_;
  std::vector<Rule> rules_;
  uint32_t root_ = 0;
};

// A GBNF string literal for `bytes` (quotes added; '"', '\\' and control characters escaped); bytes
// that are not valid UTF-8 are an error.
Result<std::string> gbnf_literal(std::string_view bytes);

}  // namespace towers
