// Anonymous zero-filled memory that asks for transparent huge pages (madvise MADV_HUGEPAGE).
// For big arrays streamed end to end (packed weights, KV rows, the bandwidth probe): with 4 KiB
// pages every 4 KiB of a stream is a TLB miss and the hardware prefetchers stop at each page edge;
// decode of a 1B Q8_0 model ran at ~65% of the memory roofline on 4 KiB pages and ~90% on 2 MiB
// ones (bench/README.md). Debian's default THP mode is "madvise", so the advice is what turns them on.
#pragma once
#include <cstddef>
#include <cstdint>

namespace towers {

class HugeBuffer {
 public:
  HugeBuffer() = default;
  // Throws std::bad_alloc when the mapping fails.
  explicit HugeBuffer(size_t bytes);
  ~HugeBuffer();
  HugeBuffer(HugeBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  HugeBuffer& operator=(HugeBuffer&& o) noexcept;
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;

  uint8_t* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  uint8_t* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace towers
