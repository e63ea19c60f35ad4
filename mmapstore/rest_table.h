// The pool's segments at rest, kept compact: a session at rest is one fixed-size record (its parent,
// token count, the 64-bit hash of its tokens, where its coded record is in the cold packs, its label)
// in a dense array, found by id and by (parent, hash) through two open-addressing indexes of 16-byte
// slots. No node per segment, no token array, no trie node: a restart holds a million of them in
// ~150 B each (docs/store.md, "Sessions at rest: capacity"), where a full pool entry was ~370 B.
// Private to the pool (mmapstore/segment_pool.h says what "at rest" means); not thread-safe (the
// pool's mutex guards it).
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/model/segment.h"
#include "mmapstore/cache_trie.h"
#include "mmapstore/flat_index.h"

namespace towers {

// One segment at rest. What is rare (coded bytes not yet in the packs, a damage note, a lineage other
// than the label) lives beside it in the pool, not in every record.
struct RestRecord {
  SegmentId id = kNoSegment, parent = kNoSegment;
  uint64_t tokens_xxh3 = 0;  // xxh3_tokens of its own tokens
  int32_t length = 0, computed_pos = 0;
  uint64_t pack_offset = 0;  // its coded record in the cold packs, when `packed`
  uint32_t pack = 0, pack_length = 0, pack_crc = 0;
  KvQuant format = KvQuant::F32;
  bool packed = false;
  bool lineage_is_label = false;  // its lineage is its label (a session's turns: "session:ID")
  std::string label;
};

class RestTable {
 public:
  void reserve(size_t n);
  RestRecord* find(SegmentId id);
  const RestRecord* find(SegmentId id) const;
  // The caller checked the id is not at rest already.
  void insert(RestRecord r);
  void erase(SegmentId id);
  // fn(record) for every segment at rest below `parent` whose tokens hash to `xxh3`; stops at true.
  template <typename Fn>
  void find_by_hash(SegmentId parent, uint64_t xxh3, Fn fn) const {
    by_hash_.find(hash_key(parent, xxh3), [&](uint32_t slot) {
      const RestRecord& r = records_.items()[slot];
      return r.parent == parent && r.tokens_xxh3 == xxh3 && fn(r);
    });
  }
  // The distinct lengths of the segments at rest below `parent` and how many have each, shortest
  // first (null when none: then nothing at rest hangs below it).
  const std::vector<std::pair<int32_t, uint32_t>>* lengths_below(SegmentId parent) const;
  bool has_children(SegmentId parent) const { return lengths_.count(parent) != 0; }
  const std::vector<RestRecord>& records() const { return records_.items(); }
  size_t size() const { return records_.size(); }
  // What the table holds in RAM: records, indexes, labels on the heap, the lengths by parent.
  size_t bytes() const;

 private:
  static uint64_t hash_key(SegmentId parent, uint64_t xxh3);
  DenseById<RestRecord> records_;
  FlatIndex by_hash_;  // hash_key(parent, tokens_xxh3) -> slot in records_
  std::unordered_map<SegmentId, std::vector<std::pair<int32_t, uint32_t>>> lengths_;
};

}  // namespace towers
