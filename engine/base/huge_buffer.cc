#include "engine/base/huge_buffer.h"

#include <sys/mman.h>

#include <new>
#include <utility>

namespace towers {

HugeBuffer::HugeBuffer(size_t bytes) : n_(bytes) {
  if (bytes == 0) return;
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  madvise(m, bytes, MADV_HUGEPAGE);  // advice only: without THP the mapping simply keeps 4 KiB pages
#endif
  p_ = static_cast<uint8_t*>(m);
}

HugeBuffer::~HugeBuffer() {
  if (p_) munmap(p_, n_);
}

HugeBuffer& HugeBuffer::operator=(HugeBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) munmap(p_, n_);
    p_ = std::exchange(o.p_, nullptr);
    n_ = std::exchange(o.n_, 0);
  }
  return *this;
}

}  // namespace towers
