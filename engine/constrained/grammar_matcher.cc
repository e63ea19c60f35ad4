#include "engine/constrained/grammar_matcher.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_set>
#include <map>

#include "engine/text/tokenizer.h"

namespace towers {

// ------------------------------------------------------------------------------------------- TokenTrie

TokenTrie::TokenTrie(std::vector<std::string> pieces, std::vector<int32_t> end_of_generation,
                     bool strip_first_space)
    : pieces_(std::move(pieces)), strip_first_space_(strip_first_space) {
  is_eog_.assign(pieces_.size(), 0);
  for (int32_t id : end_of_generation) {
    if (id >= 0 && size_t(id) < pieces_.size() && !is_eog_[size_t(id)]) {
      is_eog_[size_t(id)] = 1;
      eog_.push_back(id);
    }
  }
  std::sort(eog_.begin(), eog_.end());
  // Sorted pieces give the trie in preorder: each piece adds the nodes past its common prefix with
  // the path of the previous one, and a piece that is a prefix of another comes first.
  std::vector<int32_t> order;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (!pieces_[i].empty() && !is_eog_[i]) order.push_back(int32_t(i));
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return pieces_[size_t(a)] < pieces_[size_t(b)]; });
  nodes_.push_back({0, 0, 0, 0, 0});
  std::vector<uint32_t> path{0};  // node index per depth
  std::string_view prev;
  for (int32_t id : order) {
    const std::string& p = pieces_[size_t(id)];
    size_t common = 0;
    while (common < p.size() && common < prev.size() && p[common] == prev[common]) ++common;
    for (size_t d = path.size() - 1; d > common; --d) nodes_[path[d]].end = uint32_t(nodes_.size());
    path.resize(common + 1);
    for (size_t d = common; d < p.size(); ++d) {
      path.push_back(uint32_t(nodes_.size()));
      nodes_.push_back({uint32_t(d + 1), 0, uint32_t(token_ids_.size()), uint32_t(token_ids_.size()), uint8_t(p[d])});
    }
    token_ids_.push_back(id);
    nodes_[path.back()].tokens_end = uint32_t(token_ids_.size());
    max_depth_ = std::max(max_depth_, uint32_t(p.size()));
    prev = p;
  }
  for (uint32_t n : path) nodes_[n].end = uint32_t(nodes_.size());
}

std::shared_ptr<const TokenTrie> TokenTrie::from_tokenizer(const Tokenizer& tokenizer) {
  std::vector<std::string> pieces(size_t(tokenizer.n_vocab()));
  std::vector<int32_t> eog;
  for (int32_t id = 0; id < tokenizer.n_vocab(); ++id) {
    pieces[size_t(id)] = tokenizer.token_to_piece(id);
    if (tokenizer.is_end_of_generation(id)) eog.push_back(id);
  }
  return std::make_shared<const TokenTrie>(std::move(pieces), std::move(eog), tokenizer.strips_leading_space());
}

const std::string& TokenTrie::piece(int32_t id) const {
  static const std::string kEmpty;
  return id >= 0 && size_t(id) < pieces_.size() ? pieces_[size_t(id)] : kEmpty;
}

bool TokenTrie::is_end_of_generation(int32_t id) const {
  return id >= 0 && size_t(id) < is_eog_.size() && is_eog_[size_t(id)];
}

size_t TokenTrie::memory_bytes() const {
  size_t n = nodes_.size() * sizeof(Node) + token_ids_.size() * sizeof(int32_t) + is_eog_.size();
  for (const auto& p : pieces_) n += sizeof(std::string) + (p.size() > 15 ? p.size() : 0);
  return n;
}

// ------------------------------------------------------------------------------------ GrammarAutomaton

namespace {
constexpr int32_t kUnknown = -2;

struct VecHash {
  size_t operator()(const std::vector<uint32_t>& v) const {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ v.size();
    for (uint32_t x : v) h = (h ^ x) * 0x100000001B3ull, h ^= h >> 29;
    return size_t(h);
  }
};

// The (position, return frame) pairs one transition has expanded: usually a handful, so a linear
// scan; a long chain of references that match "" makes thousands, and then a hash set.
class VisitedSet {
 public:
  void clear() {
    small_.clear();
    if (!large_.empty()) large_.clear();
  }
  bool insert(uint64_t key) {  // false: seen already
    if (large_.empty()) {
      if (std::find(small_.begin(), small_.end(), key) != small_.end()) return false;
      if (small_.size() < kSmall) {
        small_.push_back(key);
        return true;
      }
      large_.insert(small_.begin(), small_.end());
    }
    return large_.insert(key).second;
  }

 private:
  static constexpr size_t kSmall = 64;
  std::vector<uint64_t> small_;
  std::unordered_set<uint64_t> large_;
};
}  // namespace

struct GrammarAutomaton::Impl {
  struct Node {
    uint32_t pos;    // element index: a Byte element (a stack top) or a Ref (a return frame)
    int32_t parent;  // -1: bottom of the stack
  };
  struct State {
    std::vector<uint32_t> nodes;  // sorted stack tops
    bool accepting = false;
    std::unique_ptr<int32_t[]> next;  // 256 transitions, kUnknown until computed
  };

  const Grammar& g;
  const TokenTrie* trie;
  Limits limits;
  mutable std::mutex mu;
  std::vector<Node> nodes;
  std::unordered_map<uint64_t, uint32_t> node_index;
  std::vector<State> states;
  std::unordered_map<std::vector<uint32_t>, int32_t, VecHash> state_index;  // key: nodes + accepting
  size_t state_bytes = 0;
  std::unordered_map<int64_t, std::shared_ptr<const TokenMask>> masks;  // key: state * 2 + first_piece
  size_t mask_bytes = 0;
  bool exhausted = false;
  // Bytes no byte set of the grammar tells apart share a class, and so every transition.
  std::array<uint8_t, 256> byte_class{};
  std::vector<std::vector<uint8_t>> class_bytes;
  // Scratch for one transition.
  std::vector<uint32_t> tops;
  VisitedSet visited;                                    // (pos, parent) already expanded
  std::vector<std::pair<uint32_t, int32_t>> pending;     // expand()'s work list
  bool accept = false;
  std::vector<int32_t> walk;  // mask walk: state per trie depth

  Impl(const Grammar& grammar, const TokenTrie* t, Limits l) : g(grammar), trie(t), limits(l) {
    std::map<std::vector<bool>, uint8_t> classes;
    for (int b = 0; b < 256; ++b) {
      std::vector<bool> signature;
      for (const Grammar::ByteSet& s : g.byte_sets()) signature.push_back(Grammar::contains(s, uint8_t(b)));
      auto [it, added] = classes.emplace(std::move(signature), uint8_t(class_bytes.size()));
      if (added) class_bytes.emplace_back();
      byte_class[size_t(b)] = it->second;
      class_bytes[it->second].push_back(uint8_t(b));
    }
    tops.clear();
    accept = false;
    visited.clear();
    for (uint32_t alt : g.rules()[g.root()].alternatives) expand(alt, -1);
    intern_state();
  }

  uint32_t node(uint32_t pos, int32_t parent) {
    const uint64_t key = (uint64_t(pos) << 32) | uint32_t(parent + 1);
    auto [it, added] = node_index.emplace(key, uint32_t(nodes.size()));
    if (added) {
      nodes.push_back({pos, parent});
      state_bytes += sizeof(Node) + 32;
    }
    return it->second;
  }

  // Adds to `tops` every stack top reachable from position `start` with return frame `start_parent`
  // without reading a byte (pops at End, pushes at Ref); sets `accept` when the whole grammar can end.
  // A work list, not recursion: a chain of thousands of references that match "" (x{20000} of a group
  // that may be empty) would overflow the stack.
  void expand(uint32_t start, int32_t start_parent) {
    const auto& el = g.elements();
    pending.emplace_back(start, start_parent);
    while (!pending.empty()) {
      uint32_t pos = pending.back().first;
      int32_t parent = pending.back().second;
      pending.pop_back();
      for (;;) {
        if (!visited.insert((uint64_t(pos) << 32) | uint32_t(parent + 1))) break;
        const Grammar::Element e = el[pos];
        if (e.kind == Grammar::Kind::Byte) {
          tops.push_back(node(pos, parent));
          break;
        }
        if (e.kind == Grammar::Kind::End) {
          if (parent < 0) {
            accept = true;
            break;
          }
          pos = nodes[size_t(parent)].pos + 1;
          parent = nodes[size_t(parent)].parent;
          continue;
        }
        // A call in tail position returns straight to the caller's frame.
        const int32_t ret = el[pos + 1].kind == Grammar::Kind::End ? parent : int32_t(node(pos, parent));
        const auto& alts = g.rules()[e.arg].alternatives;
        for (auto alt = alts.rbegin(); alt != alts.rend(); ++alt) pending.emplace_back(*alt, ret);
        break;
      }
    }
  }

  int32_t intern_state() {
    if (tops.empty() && !accept) return kDead;
    std::sort(tops.begin(), tops.end());
    tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
    tops.push_back(accept ? 1 : 0);
    auto it = state_index.find(tops);
    if (it != state_index.end()) return it->second;
    const int32_t id = int32_t(states.size());
    state_index.emplace(tops, id);
    tops.pop_back();
    State s;
    s.nodes = tops;
    s.accepting = accept;
    states.push_back(std::move(s));
    state_bytes += 2 * tops.size() * sizeof(uint32_t) + sizeof(State) + 64;
    return id;
  }

  int32_t compute(int32_t s, uint8_t b) {
    if (state_bytes > limits.max_state_bytes) {
      exhausted = true;
      return kDead;
    }
    tops.clear();
    visited.clear();
    accept = false;
    const auto& el = g.elements();
    // expand() adds nodes but no states: states[s] stays put until intern_state().
    for (size_t i = 0; i < states[size_t(s)].nodes.size(); ++i) {
      const Node nd = nodes[states[size_t(s)].nodes[i]];
      if (Grammar::contains(g.byte_sets()[el[nd.pos].arg], b)) expand(nd.pos + 1, nd.parent);
    }
    return intern_state();
  }

  int32_t next(int32_t s, uint8_t b) {
    State& st = states[size_t(s)];
    if (!st.next) {
      st.next.reset(new int32_t[256]);
      std::fill(st.next.get(), st.next.get() + 256, kUnknown);
      state_bytes += 256 * sizeof(int32_t);
    }
    int32_t t = st.next[b];
    if (t != kUnknown) return t;
    t = compute(s, b);
    if (!exhausted) {
      for (uint8_t same : class_bytes[byte_class[b]]) states[size_t(s)].next[same] = t;
    }
    return t;
  }

  Status exhausted_status() const {
    return Status::ResourceExhausted("grammar automaton grew past its limit of " +
                                     std::to_string(limits.max_state_bytes >> 20) + " MiB (" +
                                     std::to_string(states.size()) + " states)");
  }

  std::shared_ptr<const TokenMask> compute_mask(int32_t s, bool first_piece) {
    const auto& tn = trie->nodes();
    const auto& ids = trie->token_ids();
    auto mask = std::make_shared<TokenMask>((size_t(trie->n_vocab()) + 63) / 64, 0);
    uint64_t* bits = mask->data();
    if (states[size_t(s)].accepting) {
      for (int32_t id : trie->end_of_generation()) bits[size_t(id) / 64] |= uint64_t(1) << (id % 64);
    }
    const bool strip = first_piece && trie->strip_first_space();
    walk.assign(trie->max_depth() + 1, kDead);
    walk[0] = s;
    for (size_t i = 1; i < tn.size();) {
      const TokenTrie::Node& n = tn[i];
      const int32_t from = walk[n.depth - 1];
      const int32_t to = strip && n.depth == 1 && n.byte == ' ' ? from : next(from, n.byte);
      if (to == kDead) {
        if (exhausted) return nullptr;
        i = n.end;
        continue;
      }
      walk[n.depth] = to;
      for (uint32_t k = n.tokens_begin; k < n.tokens_end; ++k) {
        const int32_t id = ids[k];
        bits[size_t(id) / 64] |= uint64_t(1) << (id % 64);
      }
      ++i;
    }
    return mask;
  }
};

GrammarAutomaton::GrammarAutomaton(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie)
    : GrammarAutomaton(std::move(grammar), std::move(trie), Limits{}) {}

GrammarAutomaton::GrammarAutomaton(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie,
                                   Limits limits)
    : grammar_(std::move(grammar)), trie_(std::move(trie)),
      impl_(std::make_unique<Impl>(*grammar_, trie_.get(), limits)) {}

GrammarAutomaton::~GrammarAutomaton() = default;

Result<int32_t> GrammarAutomaton::advance(int32_t state, std::string_view bytes) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (char c : bytes) {
    if (state == kDead) break;
    state = impl_->next(state, uint8_t(c));
    if (impl_->exhausted) return impl_->exhausted_status();
  }
  return state;
}

bool GrammarAutomaton::is_accepting(int32_t state) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return state >= 0 && impl_->states[size_t(state)].accepting;
}

bool GrammarAutomaton::can_continue(int32_t state) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return state >= 0 && !impl_->states[size_t(state)].nodes.empty();
}

Result<std::shared_ptr<const TokenMask>> GrammarAutomaton::mask(int32_t state, bool first_piece) {
  if (!trie_) return Status::InvalidArgument("grammar automaton has no vocabulary (built without a TokenTrie)");
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (state < 0) return Status::InvalidArgument("grammar: no mask for a dead state");
  first_piece = first_piece && trie_->strip_first_space();
  const int64_t key = int64_t(state) * 2 + (first_piece ? 1 : 0);
  if (auto it = impl_->masks.find(key); it != impl_->masks.end()) return it->second;
  auto m = impl_->compute_mask(state, first_piece);
  if (!m) return impl_->exhausted_status();
  const size_t bytes = m->size() * sizeof(uint64_t) + 64;
  if (impl_->mask_bytes + bytes > impl_->limits.max_mask_bytes) {
    impl_->masks.clear();
    impl_->mask_bytes = 0;
  }
  impl_->masks.emplace(key, m);
  impl_->mask_bytes += bytes;
  return std::shared_ptr<const TokenMask>(std::move(m));
}

size_t GrammarAutomaton::state_count() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->states.size();
}

size_t GrammarAutomaton::memory_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->state_bytes + impl_->mask_bytes;
}

// ----------------------------------------------------------------------------------- GrammarConstraint

GrammarConstraint::GrammarConstraint(std::shared_ptr<GrammarAutomaton> automaton)
    : automaton_(std::move(automaton)), state_(automaton_->initial_state()) {}

Result<std::shared_ptr<const TokenMask>> GrammarConstraint::allowed_tokens() {
  if (finished_) {
    const TokenTrie* t = automaton_->trie();
    return std::make_shared<const TokenMask>(t ? (size_t(t->n_vocab()) + 63) / 64 : 0, 0);
  }
  return automaton_->mask(state_, first_piece_);
}

Result<size_t> GrammarConstraint::mask_logits(std::span<float> logits) {
  auto m = allowed_tokens();
  if (!m.ok()) return m.status();
  const TokenMask& bits = **m;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  size_t allowed = 0;
  for (size_t base = 0; base < logits.size(); base += 64) {
    const size_t n = std::min<size_t>(64, logits.size() - base);
    const uint64_t w = base / 64 < bits.size() ? bits[base / 64] : 0;
    allowed += size_t(__builtin_popcountll(n == 64 ? w : w & ((uint64_t(1) << n) - 1)));
    if (w == ~uint64_t(0)) continue;
    for (uint64_t off = ~w & (n == 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1); off; off &= off - 1)
      logits[base + size_t(__builtin_ctzll(off))] = neg_inf;
  }
  return allowed;
}

Status GrammarConstraint::accept(int32_t token) {
  const TokenTrie* t = automaton_->trie();
  if (!t) return Status::InvalidArgument("grammar constraint has no vocabulary");
  if (finished_) return Status::InvalidArgument("grammar: token after the end of generation");
  if (t->is_end_of_generation(token)) {
    if (!automaton_->is_accepting(state_))
      return Status::InvalidArgument("grammar: end of generation before the grammar is complete");
    finished_ = true;
    return Status::Ok();
  }
  std::string_view bytes = t->piece(token);
  if (bytes.empty())
    return Status::InvalidArgument("grammar: token " + std::to_string(token) + " has no text and is never allowed");
  if (first_piece_ && t->strip_first_space() && bytes[0] == ' ') bytes.remove_prefix(1);
  auto next = automaton_->advance(state_, bytes);
  if (!next.ok()) return next.status();
  if (*next == GrammarAutomaton::kDead)
    return Status::InvalidArgument("grammar: token " + std::to_string(token) + " is not allowed here");
  state_ = *next;
  first_piece_ = false;
  return Status::Ok();
}

Status GrammarConstraint::accept_bytes(std::string_view bytes) {
  if (finished_) return Status::InvalidArgument("grammar: bytes after the end of generation");
  auto next = automaton_->advance(state_, bytes);
  if (!next.ok()) return next.status();
  if (*next == GrammarAutomaton::kDead) return Status::InvalidArgument("grammar: bytes rejected");
  state_ = *next;
  if (!bytes.empty()) first_piece_ = false;
  return Status::Ok();
}

bool GrammarConstraint::is_complete() const { return automaton_->is_accepting(state_); }
bool GrammarConstraint::can_continue() const { return !finished_ && automaton_->can_continue(state_); }

void GrammarConstraint::reset() {
  state_ = automaton_->initial_state();
  first_piece_ = true;
  finished_ = false;
}

}  // namespace towers
