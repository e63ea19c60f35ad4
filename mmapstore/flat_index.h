// Compact in-memory indexes for millions of small records (segments at rest, the cold packs' live
// entries): no node per record, so a record costs its own bytes plus ~16-32 bytes of index.
//   FlatIndex     uint64 key -> uint32 value (several values per key allowed), open addressing
//   DenseById<T>  records with a uint64 `id` in one array, found by id through a FlatIndex
// Not thread-safe (their owners lock).
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace towers {

// Linear probing, deletion by backward shift (no tombstones), at most 4/5 full; any capacity (a key's
// home slot is its hash scaled to the capacity), so reserve(n) costs ~n / 0.7 slots of 12 bytes, not
// the next power of two.
class FlatIndex {
 public:
  void reserve(size_t n);
  void insert(uint64_t key, uint32_t value);
  bool erase(uint64_t key, uint32_t value);                // one (key, value) pair
  bool replace(uint64_t key, uint32_t from, uint32_t to);  // one pair's value
  template <typename Fn>  // fn(value) for every value of key, until fn returns true
  void find(uint64_t key, Fn fn) const {
    if (values_.empty()) return;
    for (size_t i = home(key);; i = next(i)) {
      if (values_[i] == kEmpty) return;
      if (keys_[i] == key && fn(values_[i])) return;
    }
  }
  size_t size() const { return size_; }
  size_t bytes() const { return keys_.capacity() * sizeof(uint64_t) + values_.capacity() * sizeof(uint32_t); }
  static uint64_t mix(uint64_t x);  // splitmix64's finaliser

 private:
  static constexpr uint32_t kEmpty = UINT32_MAX;
  // Keys that differ only in their low 4 bits (consecutive segment ids: a restart adopts them in
  // order) have neighbouring homes, so a run of lookups reads a few cache lines, not one each.
  size_t home(uint64_t key) const {
    const size_t n = values_.size();
    const size_t h = static_cast<size_t>((static_cast<unsigned __int128>(mix(key >> 4)) * n) >> 64) + (key & 15);
    return h >= n ? h - n : h;
  }
  size_t next(size_t i) const { return i + 1 == values_.size() ? 0 : i + 1; }
  void grow(size_t capacity);
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> values_;  // kEmpty: a free slot
  size_t size_ = 0;
};

template <typename T>
class DenseById {
 public:
  void reserve(size_t n) {
    items_.reserve(n);
    by_id_.reserve(n);
  }
  T* find(uint64_t id) {
    T* found = nullptr;
    by_id_.find(id, [&](uint32_t slot) { return (found = &items_[slot]) != nullptr; });
    return found;
  }
  const T* find(uint64_t id) const { return const_cast<DenseById*>(this)->find(id); }
  uint32_t slot_of(const T& t) const { return static_cast<uint32_t>(&t - items_.data()); }
  // The caller checked that `t.id` is not here yet. Returns its slot.
  uint32_t insert(T t) {
    const auto slot = static_cast<uint32_t>(items_.size());
    by_id_.insert(t.id, slot);
    items_.push_back(std::move(t));
    return slot;
  }
  // Removes the record: the last one moves into its slot, and moved(record, from, to) is told so
  // (another index of the owner's may point at it). False when id is not here.
  template <typename Moved>
  bool erase(uint64_t id, Moved moved) {
    T* t = find(id);
    if (!t) return false;
    const uint32_t slot = slot_of(*t), last = static_cast<uint32_t>(items_.size() - 1);
    by_id_.erase(id, slot);
    if (slot != last) {
      by_id_.replace(items_[last].id, last, slot);
      moved(items_[last], last, slot);
      items_[slot] = std::move(items_[last]);
    }
    items_.pop_back();
    return true;
  }
  bool erase(uint64_t id) {
    return erase(id, [](const T&, uint32_t, uint32_t) {});
  }
  const std::vector<T>& items() const { return items_; }
  size_t size() const { return items_.size(); }
  size_t bytes() const { return items_.capacity() * sizeof(T) + by_id_.bytes(); }

 private:
  std::vector<T> items_;
  FlatIndex by_id_;
};

}  // namespace towers
