#include "engine/codec/range_coder.h"

#include <cassert>

namespace towers {

namespace {
constexpr uint64_t kTop = uint64_t{1} << 56;  // the range is renormalised to stay >= this
}

void RangeEncoder::put(uint8_t byte) { out_.push_back(byte); }

// Moves the top byte of low_ out. A byte of 0xFF cannot be written yet: a later carry would turn it
// into 0x00 and increment the byte before it, so such bytes are only counted (LZMA's scheme).
void RangeEncoder::shift_low() {
  const uint64_t lo = static_cast<uint64_t>(low_);
  const uint8_t carry = static_cast<uint8_t>(low_ >> 64);
  if (lo < 0xFF00000000000000ull || carry != 0) {
    if (!first_) put(static_cast<uint8_t>(cache_ + carry));
    first_ = false;
    for (; pending_ff_ > 0; --pending_ff_) put(static_cast<uint8_t>(0xFF + carry));
    cache_ = static_cast<uint8_t>(lo >> 56);
  } else {
    ++pending_ff_;
  }
  low_ = static_cast<uint64_t>(lo << 8);
}

void RangeEncoder::encode(uint64_t cum, uint64_t freq, int total_bits) {
  assert(total_bits >= 1 && total_bits <= kMaxTotalBits);
  assert(freq >= 1 && cum + freq <= (uint64_t{1} << total_bits));
  const uint64_t step = range_ >> total_bits;  // >= 2^24 because range_ >= 2^56
  low_ += static_cast<unsigned __int128>(step) * cum;
  range_ = step * freq;
  while (range_ < kTop) {
    range_ <<= 8;
    shift_low();
  }
}

std::vector<uint8_t> RangeEncoder::finish() {
  // Any value in [low, low + range) identifies the stream. Take the one with the most trailing zero
  // bits (the decoder reads zeros past the end), so at most the top byte of it needs writing (none
  // when a multiple of 2^64 fits: low + range < 2^65, so that carries at most 1 into the cache).
  for (int k = 64; k >= 56; --k) {
    const unsigned __int128 mask = (static_cast<unsigned __int128>(1) << k) - 1;
    const unsigned __int128 v = (low_ + mask) & ~mask;
    if (v - low_ < range_) {
      low_ = v;
      break;
    }
  }
  shift_low();  // writes what was pending, caches the top byte of the chosen value
  shift_low();  // writes that byte; everything below it is zero
  // The decoder reads zeros past the end, so a final zero byte is implied. Dropping only one keeps
  // the decoder's read-ahead past the end <= 8 bytes, which RangeDecoder::overrun() lets callers check.
  if (out_.size() > 1 && out_.back() == 0) out_.pop_back();
  if (out_.empty()) out_.push_back(0);
  std::vector<uint8_t> out = std::move(out_);
  *this = RangeEncoder();
  return out;
}

RangeDecoder::RangeDecoder(std::span<const uint8_t> bytes) : in_(bytes) {
  for (int i = 0; i < 8; ++i) code_ = (code_ << 8) | next();
}

uint8_t RangeDecoder::next() {
  if (pos_ < in_.size()) return in_[pos_++];
  ++overrun_;
  return 0;
}

bool RangeDecoder::target(int total_bits, uint64_t& slot) {
  if (total_bits < 1 || total_bits > RangeEncoder::kMaxTotalBits) return false;
  step_ = range_ >> total_bits;
  slot = code_ / step_;
  // The encoder never lands in the sliver [step * 2^bits, range) that rounding leaves unused.
  return (slot >> total_bits) == 0;
}

void RangeDecoder::consume(uint64_t cum, uint64_t freq) {
  code_ -= step_ * cum;
  range_ = step_ * freq;
  while (range_ < kTop) {
    code_ = (code_ << 8) | next();
    range_ <<= 8;
  }
}

}  // namespace towers
