// The cache trie: an in-memory index from token sequences to cached segments.
//
// A radix tree over token ids. Every node holds a run of token ids (its edge label); the tokens from
// the root to the end of a node are that node's *sequence*. A node may carry a payload, a SegmentId,
// meaning "the KV of this node's sequence is available as a chain of segments ending in this one".
// The payload-carrying nodes on a path are the tower: a payload whose nearest payload-carrying
// ancestor ends at token b and which itself ends at token e covers tokens [b, e) of the sequence,
// and its parent segment is that ancestor's payload (or none at the root).
//
// The trie never interprets a SegmentId beyond kNoSegment (0), which it reserves for "none"; each id
// marks exactly one sequence. What the id names (a resident segment, a file, a cold container) is the
// caller's business.
//
// Shape invariants (check_invariants() verifies them; the tests run it after every operation):
//  - the root has an empty label and never a payload (empty sequences are rejected);
//  - every other node has a non-empty label and is either payload-carrying or has >= 2 children
//    (no payload-less leaf, no payload-less single-child chain: they are pruned / merged on evict);
//  - the children of a node start with distinct tokens and are sorted by that first token.
//
// Children are a sorted vector of {first token, owning pointer} searched by binary search. Fan-out is
// small almost everywhere (platform -> a few communities -> bots -> sessions), where a flat vector is
// the most compact choice (16 bytes per child, no per-node hash table, no buckets) and the fastest to
// search; the key sits inline so the search does not touch the children. Even a node with thousands of
// children (a bot with thousands of sessions) costs O(log n) to find and one memmove of <= 16 bytes a
// child to insert, which is noise beside the prefill that creates a segment.
//
// Cost: match and insert walk the query once (O(length + nodes on the path * log fan-out)); insert
// also counts the payloads directly below a new payload placed inside existing structure; evict,
// acquire, release, fan_out are O(1) apart from the walk up to the nearest payload ancestor.
// A moved-from trie is empty and usable.
//
// Thread-compatibility: not internally synchronized. Const methods may run concurrently with each
// other; anything else needs exclusive access. The daemon wraps the trie in one mutex and holds it
// across "match, then acquire the path" so a matched segment cannot be evicted in between.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/base/status.h"

namespace towers {

using SegmentId = uint64_t;  // same alias as engine/model/segment.h
inline constexpr SegmentId kNoSegment = 0;

class CacheTrie {
 public:
  struct Limits {
    size_t max_sequence = size_t{1} << 24;  // tokens in one inserted sequence
  };

  // One segment of a matched tower: it covers tokens [begin, end) of the query.
  struct Step {
    SegmentId segment = kNoSegment;
    size_t begin = 0;
    size_t end = 0;
    bool operator==(const Step&) const = default;
  };

  struct Match {
    size_t length = 0;                // longest reusable prefix: ends at the deepest payload on the path
    SegmentId segment = kNoSegment;   // that payload (kNoSegment when length == 0)
    std::vector<Step> path;           // payloads root -> deepest; path.back().segment == segment
    size_t matched = 0;               // raw token-level match (>= length; may stop mid-edge)
  };

  struct InsertResult {
    SegmentId segment = kNoSegment;  // the id now registered for the sequence
    bool inserted = false;           // false: the sequence already had a payload, which was kept
  };

  // Everything known about one payload.
  struct PayloadInfo {
    SegmentId segment = kNoSegment;
    SegmentId parent = kNoSegment;   // nearest payload-carrying ancestor, kNoSegment at the top
    size_t begin = 0;                // = the parent's end (0 at the top)
    size_t end = 0;                  // token length of the whole sequence root..this node
    size_t depth = 0;                // number of payload-carrying ancestors
    uint64_t refcount = 0;
    size_t fan_out = 0;              // payload-carrying descendants directly below (see fan_out())
    size_t children = 0;             // child edges of the node (radix fan-out)
  };

  struct Stats {
    size_t nodes = 0;        // excluding the root
    size_t payloads = 0;
    size_t edge_tokens = 0;  // token ids stored in labels (each distinct prefix counted once)
    size_t bytes = 0;        // estimate of heap + object bytes held by the trie
  };

  CacheTrie();
  explicit CacheTrie(Limits limits);
  ~CacheTrie();
  CacheTrie(const CacheTrie&) = delete;
  CacheTrie& operator=(const CacheTrie&) = delete;
  CacheTrie(CacheTrie&&) noexcept;
  CacheTrie& operator=(CacheTrie&&) noexcept;

  // Registers that the KV of the whole sequence `tokens` is available as segment `id` (ending exactly
  // at tokens.size()); splits an edge when the sequence ends or diverges inside it.
  // Re-inserting a sequence that already has a payload keeps the existing payload (its refcount and
  // dependents stay valid) and returns {existing id, inserted = false}; the caller drops its duplicate.
  // Errors (nothing changes): empty or too long sequence, negative token id, id == kNoSegment, id
  // already registered for a different sequence.
  Result<InsertResult> insert(std::span<const int32_t> tokens, SegmentId id);

  // Longest prefix of `tokens` ending at a payload, the tower of payloads along it and the raw match.
  Match match(std::span<const int32_t> tokens) const;

  // Pins / unpins a payload while a session uses it. Errors: unknown id; release with refcount 0.
  Status acquire(SegmentId id);
  Status release(SegmentId id);

  // Removes a payload if nobody holds it (refcount 0) and no payload below depends on it (segments
  // below were computed on top of this one). Prunes the nodes left without payload and children and
  // merges payload-less single-child chains. The error message says why it refused.
  Status evict(SegmentId id);

  // Number of payload-carrying descendants directly below the payload: those whose nearest payload
  // ancestor it is (a community segment's fan-out is its bots). Input for the pinning policy.
  Result<size_t> fan_out(SegmentId id) const;
  // Payloads at the top of the trie (no payload ancestor): the fan-out of the virtual root.
  size_t root_fan_out() const;

  bool contains(SegmentId id) const { return index_.count(id) != 0; }
  Result<PayloadInfo> info(SegmentId id) const;
  // The whole token sequence a payload stands for (root..its end).
  Result<std::vector<int32_t>> sequence(SegmentId id) const;

  Stats stats() const;
  size_t size() const { return index_.size(); }  // payloads
  bool empty() const { return index_.empty(); }

  // Visits every payload, parents before children, children in token order. fn must not modify the
  // trie.
  void for_each(const std::function<void(const PayloadInfo&)>& fn) const;

  // Verifies every structural invariant and every maintained counter (O(nodes); tests and debugging).
  Status check_invariants() const;

 private:
  struct Node;
  struct Child {
    int32_t first;               // == node->label[0]
    std::unique_ptr<Node> node;
  };
  struct Node {
    std::vector<int32_t> label;  // exact capacity: shrunk on split
    std::vector<Child> children; // sorted by first, distinct
    Node* parent = nullptr;
    size_t end = 0;              // sequence length root..end of this node
    SegmentId payload = kNoSegment;
    uint64_t refcount = 0;
    size_t payload_children = 0; // nearest payload descendants (root: top-level payloads)
  };

  static Child* find_child(Node* n, int32_t first);
  static const Child* find_child(const Node* n, int32_t first);
  Node* attach(Node* parent, std::vector<int32_t> label);
  Node* split(Node* child, size_t k);
  static const Node* payload_ancestor(const Node* n);  // nearest payload ancestor, or the root
  const Node* find_exact(std::span<const int32_t> tokens) const;
  static size_t count_payload_frontier(const Node* n);
  void remove_leaf(Node* n);
  void merge_into_child(Node* n);
  PayloadInfo make_info(const Node* n, size_t depth) const;
  void destroy();

  Limits limits_;
  std::unique_ptr<Node> root_;
  std::unordered_map<SegmentId, Node*> index_;
  size_t nodes_ = 0;
  size_t edge_tokens_ = 0;
};

}  // namespace towers
