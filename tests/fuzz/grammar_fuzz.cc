// libFuzzer target for the GBNF parser and the byte automaton behind constrained decoding
// (engine/constrained/grammar.h, grammar_matcher.h). Input: GBNF text, then optionally a NUL byte
// and bytes to feed the automaton one at a time. A grammar either fails with a message or compiles;
// a compiled grammar's dump() must not crash, and walking it byte by byte (and asking each live state
// for its token mask over a small byte vocabulary) must stay within the automaton's limits.
#include "engine/constrained/grammar.h"
#include "engine/constrained/grammar_matcher.h"
#include "fuzz/fuzz_support.h"

using namespace towers;

namespace {
constexpr const char* kTarget = "grammar_fuzz";

std::shared_ptr<const TokenTrie> byte_trie() {
  // Every single byte, a few multi-byte pieces, and an end-of-generation token.
  std::vector<std::string> pieces;
  for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, static_cast<char>(b)));
  for (const char* p : {" the", "ab", "{\"", "\":", "\xC3\xA9", "\xE2\x82\xAC", "12", "true", "null"}) pieces.push_back(p);
  const int32_t eog = static_cast<int32_t>(pieces.size());
  pieces.push_back("");
  return std::make_shared<TokenTrie>(std::move(pieces), std::vector<int32_t>{eog}, false);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto trie = byte_trie();
  const auto [gbnf, walk] = fuzz::split_at(fuzz::text_of(data, size), '\0');
  auto g = Grammar::parse(gbnf);
  if (!g.ok()) {
    if (g.error().empty()) fuzz::die(kTarget, "a refused grammar without a message");
    return 0;
  }
  (void)(*g)->dump();
  GrammarAutomaton::Limits limits;
  limits.max_state_bytes = size_t(2) << 20;
  limits.max_mask_bytes = size_t(4) << 20;
  GrammarAutomaton automaton(*g, trie, limits);
  int32_t state = automaton.initial_state();
  for (size_t i = 0; i <= walk.size() && state != GrammarAutomaton::kDead; ++i) {
    auto mask = automaton.mask(state, i == 0);
    if (!mask.ok()) return 0;  // ResourceExhausted: a limit, reported
    if (i == walk.size()) break;
    auto next = automaton.advance(state, walk.substr(i, 1));
    if (!next.ok()) return 0;
    // A byte the mask allows must be one the automaton accepts, and the other way round.
    const bool allowed = mask_allows(**mask, static_cast<uint8_t>(walk[i]));
    if (allowed != (*next != GrammarAutomaton::kDead)) fuzz::die(kTarget, "the token mask disagrees with advance()");
    state = *next;
  }
  return 0;
}
