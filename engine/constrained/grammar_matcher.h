// Matching a Grammar (engine/constrained/grammar.h) byte by byte and token by token, for constrained decoding.
//
//   auto trie = TokenTrie::from_tokenizer(tokenizer);              // once per model
//   auto grammar = Grammar::parse(gbnf);                           // or json_schema_to_gbnf(...)
//   auto automaton = std::make_shared<GrammarAutomaton>(*grammar, trie);  // per grammar, shareable
//   GrammarConstraint c(automaton);                                // per generation, cheap to copy
//   loop: c.mask_logits(logits) → sample → c.accept(token)         // (Decoder does this: decoder.h)
//
// How it works. The matcher is llama.cpp's stack-set recognizer over bytes: a parse position is a stack
// of grammar positions (the top one a byte set to match next), and a matcher state is the set of all
// stacks the bytes so far allow, plus whether the grammar may end here. Stacks are persistent lists of
// interned nodes (position, parent), calls in tail position reuse their caller's frame (so x* and
// right recursion do not grow the stack), and every state is interned: equal stack sets get one id.
// Transitions (state, byte) → state are computed once and kept in a 256-entry table per state, so a
// state is then a small integer and cloning a constraint copies an integer.
//
// Token masks walk a trie of the vocabulary's token bytes (stored in preorder: a dead transition skips
// the whole subtree) from the current state, and are cached per state: inside a JSON string, say, the
// state recurs after every character and its mask is computed once. The cost of a new state is the
// number of live trie nodes (far below vocab × token length: shared prefixes are walked once and dead
// prefixes cut whole subtrees); bench/bench_grammar.cc measures it.
//
// Token bytes are Tokenizer::token_to_piece (SentencePiece "▁" as space, <0xAB> byte-fallback tokens as
// that byte, byte-level BPE decoded), and for SentencePiece vocabularies whose Detokenizer drops the
// leading space of the first piece, the constraint drops it too: the grammar matches the text the
// client sees. Tokens with no bytes (control tokens) are never allowed; end-of-generation tokens are
// allowed exactly when the grammar is complete.
//
// Threads: TokenTrie is immutable. GrammarAutomaton is internally locked, so constraints of different
// generations (threads) may share one. One GrammarConstraint is used by one thread at a time.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/constrained/grammar.h"
#include "engine/base/status.h"

namespace towers {

class Tokenizer;

// Bits over token ids: bit i set = token i allowed.
using TokenMask = std::vector<uint64_t>;
inline bool mask_allows(const TokenMask& m, int32_t id) {
  return id >= 0 && size_t(id) / 64 < m.size() && (m[size_t(id) / 64] >> (id % 64)) & 1;
}

// The vocabulary's token bytes, as a trie in preorder.
class TokenTrie {
 public:
  // pieces[id]: the bytes of token id ("" = never allowed unless it ends generation);
  // end_of_generation: ids that end a generation; strip_first_space: the text drops the leading space
  // of the first non-empty piece (Detokenizer's SentencePiece rule).
  TokenTrie(std::vector<std::string> pieces, std::vector<int32_t> end_of_generation, bool strip_first_space);
  static std::shared_ptr<const TokenTrie> from_tokenizer(const Tokenizer& tokenizer);

  int32_t n_vocab() const { return int32_t(pieces_.size()); }
  const std::string& piece(int32_t id) const;  // "" when out of range
  bool is_end_of_generation(int32_t id) const;
  const std::vector<int32_t>& end_of_generation() const { return eog_; }
  bool strip_first_space() const { return strip_first_space_; }

  struct Node {
    uint32_t depth;       // bytes from the root (root: 0)
    uint32_t end;         // one past the last node of this node's subtree
    uint32_t tokens_begin, tokens_end;  // ids of tokens whose bytes end here: token_ids()[begin, end)
    uint8_t byte;         // the byte on the edge into this node
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }
  uint32_t max_depth() const { return max_depth_; }
  size_t memory_bytes() const;

 private:
  std::vector<std::string> pieces_;
  std::vector<int32_t> eog_;
  std::vector<uint8_t> is_eog_;
  bool strip_first_space_;
  std::vector<Node> nodes_;
  std::vector<int32_t> token_ids_;
  uint32_t max_depth_ = 0;
};

// The lazily built automaton of one grammar (and, for token masks, one vocabulary). States, transitions
// and masks only grow; keep one per grammar while memory_bytes() is acceptable, then start a new one
// (constraints keep theirs alive).
class GrammarAutomaton {
 public:
  struct Limits {
    size_t max_state_bytes = size_t(512) << 20;  // states + transitions; beyond: ResourceExhausted
    size_t max_mask_bytes = size_t(64) << 20;    // cached masks; beyond: the cache is emptied
  };
  // trie may be null: then only byte matching (advance) is available.
  GrammarAutomaton(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie);
  GrammarAutomaton(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie, Limits limits);
  ~GrammarAutomaton();

  static constexpr int32_t kDead = -1;
  int32_t initial_state() const { return 0; }
  // The state after `bytes`, kDead when the grammar rejects them; ResourceExhausted past the limit.
  Result<int32_t> advance(int32_t state, std::string_view bytes);
  bool is_accepting(int32_t state) const;    // the grammar may end here
  bool can_continue(int32_t state) const;    // some non-empty continuation exists
  // The tokens allowed in `state` (end-of-generation ones iff accepting). first_piece: the token is the
  // generation's first non-empty one (its leading space is dropped when the trie says so).
  Result<std::shared_ptr<const TokenMask>> mask(int32_t state, bool first_piece);

  const Grammar& grammar() const { return *grammar_; }
  const TokenTrie* trie() const { return trie_.get(); }
  size_t state_count() const;
  size_t memory_bytes() const;

 private:
  struct Impl;
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenTrie> trie_;
  std::unique_ptr<Impl> impl_;
};

// One generation's position in the grammar. Copying it clones the position (same automaton).
class GrammarConstraint {
 public:
  explicit GrammarConstraint(std::shared_ptr<GrammarAutomaton> automaton);

  // Sets the logits of tokens the grammar does not allow to -infinity; returns how many are allowed
  // (0: no token can continue, e.g. a finished grammar on a vocabulary without an end token).
  Result<size_t> mask_logits(std::span<float> logits);
  Result<std::shared_ptr<const TokenMask>> allowed_tokens();
  // Advances by one token (InvalidArgument if the grammar does not allow it; an end-of-generation
  // token is allowed only when complete and finishes the constraint).
  Status accept(int32_t token);
  // Advances by raw bytes (tests, forced prefixes); InvalidArgument when rejected (state unchanged).
  Status accept_bytes(std::string_view bytes);

  bool is_complete() const;  // the output so far is a full sentence of the grammar
  bool can_continue() const;
  bool finished() const { return finished_; }  // an end-of-generation token was accepted
  void reset();
  const GrammarAutomaton& automaton() const { return *automaton_; }

 private:
  std::shared_ptr<GrammarAutomaton> automaton_;
  int32_t state_;
  bool first_piece_ = true;  // no non-empty piece accepted yet
  bool finished_ = false;
};

}  // namespace towers
