// Helpers for the grammar tests: matching whole texts, and generating under a grammar's token mask
// from random logits (seeded), as a model with no preferences would.
#pragma once
#include <memory>
#include <random>
#include <string>
#include <string_view>

#include "engine/constrained/grammar.h"
#include "engine/constrained/grammar_matcher.h"
#include "engine/generate/sampler.h"
#include "engine/text/tokenizer.h"
#include "test_support.h"

namespace towers::test {

// The matcher's state after `text` (kDead when rejected).
inline std::pair<std::unique_ptr<GrammarAutomaton>, int32_t> run_grammar(const std::shared_ptr<const Grammar>& g,
                                                                          std::string_view text) {
  auto a = std::make_unique<GrammarAutomaton>(g, nullptr);
  auto s = a->advance(a->initial_state(), text);
  REQUIRE(s.ok());
  return {std::move(a), *s};
}
// Whether the whole of `text` is a sentence of the grammar.
inline bool grammar_accepts(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  auto [a, s] = run_grammar(g, text);
  return s != GrammarAutomaton::kDead && a->is_accepting(s);
}
// Whether `text` can be continued into a sentence.
inline bool grammar_viable(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  return run_grammar(g, text).second != GrammarAutomaton::kDead;
}

struct Sampled {
  std::string text;       // as the Detokenizer shows it
  bool complete = false;  // ended by an end-of-generation token
};

// Random normal logits (seeded), masked, sampled at temperature 1 with no other filter.
inline Sampled sample_random(const Tokenizer& tok, std::shared_ptr<GrammarAutomaton> automaton, uint64_t seed,
                             int max_tokens) {
  GrammarConstraint c(std::move(automaton));
  SamplerConfig sc;
  sc.temperature = 1.0f;
  sc.top_k = 0;
  sc.top_p = 1.0f;
  sc.min_p = 0.0f;
  sc.seed = seed;
  Sampler sampler(sc);
  std::mt19937_64 rng{seed};
  std::normal_distribution<float> normal(0.0f, 2.0f);
  Detokenizer detok(tok);
  std::vector<float> logits(size_t(tok.n_vocab()));
  Sampled out;
  for (int t = 0; t < max_tokens && !out.complete; ++t) {
    for (float& l : logits) l = normal(rng);
    auto n = c.mask_logits(logits);
    REQUIRE_MESSAGE(n.ok(), n.status().message());
    REQUIRE(*n > 0);
    const int32_t id = sampler.sample(logits, {});
    REQUIRE(c.accept(id).ok());
    if (tok.is_end_of_generation(id)) out.complete = true;
    else out.text += detok.feed(id);
  }
  out.text += detok.flush();
  return out;
}

}  // namespace towers::test
