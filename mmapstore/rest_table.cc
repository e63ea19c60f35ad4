#include "mmapstore/rest_table.h"

#include <algorithm>

namespace towers {

uint64_t RestTable::hash_key(SegmentId parent, uint64_t xxh3) { return xxh3 ^ FlatIndex::mix(parent + 0x9e3779b97f4a7c15ull); }

void RestTable::reserve(size_t n) {
  records_.reserve(n);
  by_hash_.reserve(n);
}

RestRecord* RestTable::find(SegmentId id) { return records_.find(id); }
const RestRecord* RestTable::find(SegmentId id) const { return records_.find(id); }

void RestTable::insert(RestRecord r) {
  auto& lengths = lengths_[r.parent];
  auto at = std::lower_bound(lengths.begin(), lengths.end(), std::pair(r.length, uint32_t{0}));
  if (at != lengths.end() && at->first == r.length) ++at->second;
  else lengths.insert(at, {r.length, 1});
  const uint64_t key = hash_key(r.parent, r.tokens_xxh3);
  by_hash_.insert(key, records_.insert(std::move(r)));
}

void RestTable::erase(SegmentId id) {
  const RestRecord* r = find(id);
  if (!r) return;
  by_hash_.erase(hash_key(r->parent, r->tokens_xxh3), records_.slot_of(*r));
  if (auto l = lengths_.find(r->parent); l != lengths_.end()) {
    auto at = std::lower_bound(l->second.begin(), l->second.end(), std::pair(r->length, uint32_t{0}));
    if (at != l->second.end() && at->first == r->length && --at->second == 0) l->second.erase(at);
    if (l->second.empty()) lengths_.erase(l);
  }
  records_.erase(id, [&](const RestRecord& moved, uint32_t from, uint32_t to) {
    by_hash_.replace(hash_key(moved.parent, moved.tokens_xxh3), from, to);
  });
}

const std::vector<std::pair<int32_t, uint32_t>>* RestTable::lengths_below(SegmentId parent) const {
  auto it = lengths_.find(parent);
  return it == lengths_.end() ? nullptr : &it->second;
}

size_t RestTable::bytes() const {
  size_t n = records_.bytes() + by_hash_.bytes();
  for (const RestRecord& r : records_.items()) n += r.label.size() > 15 ? r.label.capacity() + 1 : 0;
  // A node of the lengths map: key, vector, link, cached hash (~56 bytes) and its lengths.
  for (const auto& [parent, l] : lengths_) n += 56 + l.capacity() * sizeof(l[0]);
  return n + lengths_.bucket_count() * sizeof(void*);
}

}  // namespace towers
