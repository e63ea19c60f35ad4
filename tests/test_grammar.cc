// The grammar engine: GBNF parsing and its errors, byte-level matching (UTF-8 classes, repetition,
// recursion), and token masks checked against a brute-force reference (every token's bytes run
// through the matcher one by one) on synthetic and real vocabularies.
#include <random>

#include "engine/constrained/grammar.h"
#include "engine/constrained/grammar_matcher.h"
#include "grammar_fixtures.h"
#include "test_support.h"

using namespace towers;

namespace {

std::shared_ptr<const Grammar> compile(std::string_view gbnf) {
  auto g = Grammar::parse(gbnf);
  REQUIRE_MESSAGE(g.ok(), g.error());
  return *g;
}

bool matches(const std::shared_ptr<const Grammar>& g, std::string_view text) { return test::grammar_accepts(g, text); }
bool viable(const std::shared_ptr<const Grammar>& g, std::string_view text) { return test::grammar_viable(g, text); }

std::string parse_error(std::string_view gbnf) {
  auto g = Grammar::parse(gbnf);
  REQUIRE_FALSE(g.ok());
  return g.error();
}

}  // namespace

TEST_CASE("literals, alternatives, sequences") {
  auto g = compile(R"(root ::= "ab" | "c" d
                      d ::= "x" | "")");
  CHECK(matches(g, "ab"));
  CHECK(matches(g, "c"));
  CHECK(matches(g, "cx"));
  CHECK_FALSE(matches(g, "a"));
  CHECK(viable(g, "a"));
  CHECK_FALSE(matches(g, "abc"));
  CHECK_FALSE(viable(g, "abc"));
  CHECK_FALSE(matches(g, ""));
  CHECK_FALSE(matches(g, "cxx"));
}

TEST_CASE("repetition operators") {
  auto g = compile(R"(root ::= "a"* "b"+ "c"? "d"{2} "e"{1,3} "f"{2,})");
  CHECK(matches(g, "bddeff"));
  CHECK(matches(g, "aaabbcddeeefffff"));
  CHECK_FALSE(matches(g, "ddeff"));        // b+ needs one
  CHECK_FALSE(matches(g, "bccddeff"));     // c? at most one
  CHECK_FALSE(matches(g, "bdeff"));        // d{2}
  CHECK_FALSE(matches(g, "bddeeeeff"));    // e{1,3}
  CHECK_FALSE(matches(g, "bddef"));        // f{2,}
  auto grp = compile(R"(root ::= ("ab" | "c"){0,2} "!")");
  CHECK(matches(grp, "!"));
  CHECK(matches(grp, "abc!"));
  CHECK(matches(grp, "cc!"));
  CHECK_FALSE(matches(grp, "abcab!"));
}

TEST_CASE("character classes over code points, matched as UTF-8") {
  auto g = compile(R"(root ::= [a-c\-]+ [^a-z] .)");
  CHECK(matches(g, "ab-X\xC3\xA9"));          // é
  CHECK(matches(g, "c\xE2\x82\xAC" "a"));       // € as the negated class, then any
  CHECK(matches(g, "a1\xF0\x9F\x98\x80"));     // U+1F600 as '.'
  CHECK_FALSE(matches(g, "aqz"));
  CHECK_FALSE(viable(g, "a\xC3"  "\x28"));      // broken UTF-8: lead byte then non-continuation
  CHECK_FALSE(viable(g, "a\xED\xA0\x80"));     // a surrogate code point is never matched
  CHECK_FALSE(viable(g, "a\xC0\xAF"));         // overlong
  CHECK_FALSE(viable(g, "a\xF4\x90\x80\x80")); // above U+10FFFF
  CHECK(viable(g, "a\xE2\x82"));               // an unfinished character is a viable prefix
  auto range = compile(R"(root ::= [\u00e0-\u00ff\U0001F600-\U0001F64F]+)");
  CHECK(matches(range, "\xC3\xA0\xC3\xBF\xF0\x9F\x98\x80\xF0\x9F\x99\x8F"));
  CHECK_FALSE(matches(range, "\xC3\x9F"));         // U+00DF
  CHECK_FALSE(matches(range, "\xF0\x9F\x99\x90"));  // U+1F650
}

TEST_CASE("every code point of a class boundary, exhaustively against a direct test") {
  // [^"\\\x00-\x1f] over a sample of every UTF-8 length class, including range edges.
  auto g = compile(R"(root ::= [^"\\\x00-\x1f])");
  std::vector<uint32_t> cps;
  for (uint32_t cp = 0; cp < 0x3000; ++cp) cps.push_back(cp);
  for (uint32_t cp : {0xD7FFu, 0xD800u, 0xDFFFu, 0xE000u, 0xFFFDu, 0xFFFFu, 0x10000u, 0x3FFFFu, 0x40000u,
                      0xFFFFFu, 0x100000u, 0x10FFFFu})
    cps.push_back(cp);
  for (uint32_t cp : cps) {
    std::string s;
    if (cp < 0x80) s = std::string(1, char(cp));
    else if (cp < 0x800) s = {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
    else if (cp < 0x10000) s = {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
    else
      s = {char(0xF0 | (cp >> 18)), char(0x80 | ((cp >> 12) & 0x3F)), char(0x80 | ((cp >> 6) & 0x3F)),
           char(0x80 | (cp & 0x3F))};
    const bool expect = cp >= 0x20 && cp != '"' && cp != '\\' && !(cp >= 0xD800 && cp <= 0xDFFF);
    CAPTURE(cp);
    CHECK(matches(g, s) == expect);
  }
}

TEST_CASE("recursion: nesting, and tail calls that do not grow the state set") {
  auto g = compile(R"g(root ::= "(" root ")" | "x")g");
  CHECK(matches(g, "((x))"));
  CHECK_FALSE(matches(g, "((x)"));
  CHECK(viable(g, "((((("));
  // A long run through x* must keep revisiting the same state.
  auto star = compile(R"(root ::= "<" [a-z]* ">")");
  GrammarAutomaton a(star, nullptr);
  auto s = a.advance(a.initial_state(), "<" + std::string(10000, 'q'));
  REQUIRE(s.ok());
  CHECK(*s != GrammarAutomaton::kDead);
  CHECK(a.state_count() <= 4);
  auto right = compile(R"(root ::= "<" list
                          list ::= ">" | "a" list)");
  GrammarAutomaton b(right, nullptr);
  CHECK(b.advance(b.initial_state(), "<" + std::string(5000, 'a')).ok());
  CHECK(b.state_count() <= 4);
}

TEST_CASE("comments, rule order, multi-line rules") {
  auto g = compile(R"(# leading comment
    root ::= greeting " " name   # trailing comment
    name ::=
      "world"
      | "you"
    greeting ::= "hello" | "hi")");
  CHECK(matches(g, "hello world"));
  CHECK(matches(g, "hi you"));
  CHECK_FALSE(matches(g, "hi  you"));
}

TEST_CASE("errors name the problem") {
  CHECK(parse_error("").find("empty") != std::string::npos);
  CHECK(parse_error("root ::= foo").find("'foo' is used but never defined") != std::string::npos);
  CHECK(parse_error("start ::= \"a\"").find("no rule named 'root'") != std::string::npos);
  CHECK(parse_error("root ::= root \"a\" | \"b\"").find("left recursion (root -> root)") != std::string::npos);
  CHECK(parse_error("root ::= e a\ne ::= \"\" | \"x\"\na ::= root \"y\" | \"z\"").find("left recursion") !=
        std::string::npos);
  CHECK(parse_error("root ::= \"(\" root \")\"").find("can never finish") != std::string::npos);
  CHECK(parse_error("root ::= \"a\nb").find("line") != std::string::npos);
  CHECK(parse_error("root ::= \"abc").find("unterminated string literal") != std::string::npos);
  CHECK(parse_error("root ::= [a-").find("unterminated character class") != std::string::npos);
  CHECK(parse_error("root ::= [z-a]").find("backwards") != std::string::npos);
  CHECK(parse_error("root ::= \"\\q\"").find("unknown escape") != std::string::npos);
  CHECK(parse_error("root ::= \"\\uD800\"").find("scalar") != std::string::npos);
  CHECK(parse_error("root ::= \"a\"{3,1}").find("n < m") != std::string::npos);
  CHECK(parse_error("root ::= \"a\"{1,999999}").find("repetition count above") != std::string::npos);
  CHECK(parse_error("root ::= (\"a\"").find("expected ')'") != std::string::npos);
  CHECK(parse_error("root ::= \"a\"\nroot ::= \"b\"").find("defined twice") != std::string::npos);
  CHECK(parse_error("root ::= [^\\x00-\\U0010FFFF]").find("matches nothing") != std::string::npos);
  CHECK(parse_error("root ::= @").find("unexpected character '@'") != std::string::npos);
}

TEST_CASE("long chains and deep nesting: bounded stack, an error past the limit") {
  // grammar_fuzz's finding: an empty group repeated thousands of times made the matcher recurse once
  // per repetition when it expanded the start state (a stack overflow).
  auto empty = compile("root ::= (){22551} .?\n");
  CHECK(matches(empty, ""));
  CHECK(matches(empty, "x"));
  CHECK_FALSE(matches(empty, "xy"));
  auto optional = compile(R"(root ::= ("a"?){20000} "b")");
  CHECK(matches(optional, "b"));
  CHECK(matches(optional, "aaab"));
  CHECK_FALSE(matches(optional, "ba"));
  // A left-recursive cycle through 30000 rules is found (the check's depth-first search had recursed
  // once per rule), and named from where it starts.
  std::string chain = "root ::= r0\n";
  for (int i = 0; i < 30000; ++i) chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + " \"x\" | \"y\"\n";
  auto no_cycle = Grammar::parse(chain + "r30000 ::= \"z\"\n");
  CHECK_MESSAGE(no_cycle.ok(), no_cycle.error());
  const std::string cycle = parse_error(chain + "r30000 ::= r0\n");
  CHECK(cycle.find("left recursion (r0 -> r1 -> ") != std::string::npos);
  CHECK(cycle.find("r30000 -> r0)") != std::string::npos);
  // Groups are parsed recursively, so their depth is bounded.
  const auto nested = [](int depth) {
    return "root ::= " + std::string(size_t(depth), '(') + "\"a\"" + std::string(size_t(depth), ')') + "\n";
  };
  CHECK(matches(compile(nested(Grammar::kMaxGroupDepth)), "a"));
  CHECK(parse_error(nested(Grammar::kMaxGroupDepth + 1)).find("nested deeper than") != std::string::npos);
  CHECK(parse_error(nested(200000)).find("nested deeper than") != std::string::npos);
}

TEST_CASE("alternatives that can never finish are dropped") {
  // loop can never finish, so "b" loop is dropped and only "a" remains: no prefix leads nowhere.
  auto g = compile(R"(root ::= "a" | "b" loop
                      loop ::= "c" loop)");
  CHECK(matches(g, "a"));
  CHECK_FALSE(viable(g, "b"));
}

TEST_CASE("gbnf_literal escapes and round-trips") {
  const std::string text = "say \"hi\"\\\n\t\x01 caf\xC3\xA9";
  auto lit = gbnf_literal(text);
  REQUIRE(lit.ok());
  auto g = compile("root ::= " + *lit);
  CHECK(matches(g, text));
  CHECK_FALSE(gbnf_literal("\xFF").ok());
}

// ----------------------------------------------------------------------------------------- token masks

namespace {

// The reference: a token is allowed when its bytes (leading space dropped for a first piece when the
// trie says so) lead to a live state, or it ends generation and the state is accepting.
TokenMask brute_force_mask(GrammarAutomaton& a, const TokenTrie& trie, int32_t state, bool first_piece) {
  TokenMask m((size_t(trie.n_vocab()) + 63) / 64, 0);
  for (int32_t id = 0; id < trie.n_vocab(); ++id) {
    bool ok;
    if (trie.is_end_of_generation(id)) {
      ok = a.is_accepting(state);
    } else {
      std::string_view p = trie.piece(id);
      if (first_piece && trie.strip_first_space() && !p.empty() && p[0] == ' ') p.remove_prefix(1);
      auto s = a.advance(state, p);
      REQUIRE(s.ok());
      ok = !trie.piece(id).empty() && *s != GrammarAutomaton::kDead;
    }
    if (ok) m[size_t(id) / 64] |= uint64_t(1) << (id % 64);
  }
  return m;
}

}  // namespace

TEST_CASE("token masks equal the brute-force reference along random walks") {
  std::vector<std::string> pieces = {"", "{", "}", "\"", "\"a", "a", "ab", "abc", " ", " {", "\":", ":",
                                     ",", "\",\"", "\xC3", "\xA9", "\xC3\xA9", "1", "12", "-", "true", "tr",
                                     "ue", "null", "}}", " \"", "\n", "x\"", "\\", "\\n", "\xE2\x82\xAC"};
  const int32_t eos = int32_t(pieces.size());
  pieces.push_back("");
  auto g = compile(R"(root ::= "{" ( pair ( "," pair )* )? "}"
                      pair ::= str ":" val
                      val ::= str | "true" | "null" | "-"? [0-9]+ | root
                      str ::= "\"" ( [^"\\] | "\\" [n"\\] )* "\"")");
  for (bool strip : {false, true}) {
    auto trie = std::make_shared<const TokenTrie>(pieces, std::vector<int32_t>{eos}, strip);
    auto automaton = std::make_shared<GrammarAutomaton>(g, trie);
    std::mt19937 rng(strip ? 7 : 3);
    for (int walk = 0; walk < 200; ++walk) {
      GrammarConstraint c(automaton);
      int32_t state = automaton->initial_state();
      bool first = true;
      for (int step = 0; step < 40; ++step) {
        auto m = c.allowed_tokens();
        REQUIRE(m.ok());
        const TokenMask expect = brute_force_mask(*automaton, *trie, state, first);
        REQUIRE(**m == expect);
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < trie->n_vocab(); ++id)
          if (mask_allows(expect, id)) allowed.push_back(id);
        REQUIRE_FALSE(allowed.empty());  // pruned grammar: every viable prefix can go on
        const int32_t tok = allowed[rng() % allowed.size()];
        REQUIRE(c.accept(tok).ok());
        if (tok == eos) {
          CHECK(c.finished());
          break;
        }
        std::string_view p = trie->piece(tok);
        if (first && strip && p[0] == ' ') p.remove_prefix(1);
        state = *automaton->advance(state, p);
        first = false;
      }
    }
  }
}

TEST_CASE("constraint: end of generation only when complete, mask_logits, clone and reset") {
  std::vector<std::string> pieces = {"a", "b", "ab", "", ""};  // 3: eos, 4: a control token
  auto trie = std::make_shared<const TokenTrie>(pieces, std::vector<int32_t>{3}, false);
  auto automaton = std::make_shared<GrammarAutomaton>(compile(R"(root ::= "a" "b"?)"), trie);
  GrammarConstraint c(automaton);
  std::vector<float> logits(5, 1.0f);
  auto n = c.mask_logits(logits);
  REQUIRE(n.ok());
  CHECK(*n == 2);  // "a", "ab"
  CHECK(logits == std::vector<float>{1.0f, -INFINITY, 1.0f, -INFINITY, -INFINITY});
  CHECK_FALSE(c.accept(3).ok());  // eos before complete
  CHECK_FALSE(c.accept(1).ok());
  CHECK_FALSE(c.accept(4).ok());  // no bytes: never allowed
  REQUIRE(c.accept(0).ok());
  CHECK(c.is_complete());
  GrammarConstraint clone = c;
  REQUIRE(clone.accept(1).ok());
  CHECK(clone.is_complete());
  CHECK_FALSE(clone.can_continue());
  logits.assign(5, 0.0f);
  CHECK(*clone.mask_logits(logits) == 1);  // only eos
  CHECK(logits[3] == 0.0f);
  REQUIRE(clone.accept(3).ok());
  CHECK(clone.finished());
  CHECK_FALSE(clone.accept(0).ok());
  // The original is where it was.
  CHECK(c.can_continue());
  logits.assign(5, 0.0f);
  CHECK(*c.mask_logits(logits) == 2);  // "b", eos
  c.reset();
  CHECK_FALSE(c.is_complete());
  CHECK(c.accept(2).ok());
}

TEST_CASE("first piece: SentencePiece's dropped leading space") {
  std::vector<std::string> pieces = {" {", "{", " ", "}", ""};
  auto g = compile(R"(root ::= "{}")");
  auto strip_trie = std::make_shared<const TokenTrie>(pieces, std::vector<int32_t>{4}, true);
  GrammarConstraint c(std::make_shared<GrammarAutomaton>(g, strip_trie));
  auto m = c.allowed_tokens();
  REQUIRE(m.ok());
  CHECK(mask_allows(**m, 0));  // " {" is shown as "{"
  CHECK(mask_allows(**m, 1));
  REQUIRE(c.accept(0).ok());
  m = c.allowed_tokens();
  CHECK_FALSE(mask_allows(**m, 0));  // only the first piece loses its space
  CHECK(mask_allows(**m, 3));
  auto keep_trie = std::make_shared<const TokenTrie>(pieces, std::vector<int32_t>{4}, false);
  GrammarConstraint k(std::make_shared<GrammarAutomaton>(g, keep_trie));
  m = k.allowed_tokens();
  CHECK_FALSE(mask_allows(**m, 0));
}

TEST_CASE("automaton limit gives ResourceExhausted, not a crash") {
  auto g = compile(R"(root ::= [a-z]{0,5000})");
  GrammarAutomaton::Limits lim;
  lim.max_state_bytes = 64 << 10;
  GrammarAutomaton a(g, nullptr, lim);
  auto s = a.advance(a.initial_state(), std::string(5000, 'k'));
  REQUIRE_FALSE(s.ok());
  CHECK(s.status().code() == Status::Code::kResourceExhausted);
}
