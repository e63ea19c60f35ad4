#include "mmapstore/flat_index.h"

#include <algorithm>

namespace towers {

uint64_t FlatIndex::mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void FlatIndex::reserve(size_t n) {
  const size_t want = std::max<size_t>(16, n + n * 3 / 7 + 1);  // 70% full at n
  if (want > values_.size()) grow(want);
}

void FlatIndex::grow(size_t capacity) {
  std::vector<uint64_t> old_keys;
  std::vector<uint32_t> old_values;
  old_keys.swap(keys_);
  old_values.swap(values_);
  keys_.assign(capacity, 0);
  values_.assign(capacity, kEmpty);
  size_ = 0;
  for (size_t i = 0; i < old_values.size(); ++i) {
    if (old_values[i] != kEmpty) insert(old_keys[i], old_values[i]);
  }
}

void FlatIndex::insert(uint64_t key, uint32_t value) {
  if ((size_ + 1) * 5 > values_.size() * 4) grow(std::max<size_t>(16, values_.size() * 2));
  size_t i = home(key);
  while (values_[i] != kEmpty) i = next(i);
  keys_[i] = key;
  values_[i] = value;
  ++size_;
}

bool FlatIndex::replace(uint64_t key, uint32_t from, uint32_t to) {
  if (values_.empty()) return false;
  for (size_t i = home(key);; i = next(i)) {
    if (values_[i] == kEmpty) return false;
    if (keys_[i] == key && values_[i] == from) {
      values_[i] = to;
      return true;
    }
  }
}

bool FlatIndex::erase(uint64_t key, uint32_t value) {
  if (values_.empty()) return false;
  size_t i = home(key);
  for (;; i = next(i)) {
    if (values_[i] == kEmpty) return false;
    if (keys_[i] == key && values_[i] == value) break;
  }
  // Backward shift: a later slot of the probe run moves into the hole unless its home lies
  // cyclically in (hole, slot].
  for (size_t j = next(i); values_[j] != kEmpty; j = next(j)) {
    const size_t h = home(keys_[j]);
    const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
    if (stays) continue;
    keys_[i] = keys_[j];
    values_[i] = values_[j];
    i = j;
  }
  values_[i] = kEmpty;
  --size_;
  return true;
}

}  // namespace towers
