// A range coder (arithmetic coding with byte output) over integer frequency tables whose total is a
// power of two. It knows nothing about models: the caller supplies, for every symbol, its cumulative
// frequency `cum`, its frequency `freq` (>= 1) and the table's total 2^total_bits (total_bits <= 32).
//
// The state is 64 bits wide (LZMA's carry-propagating coder widened from 32 to 64 bits): the range
// stays >= 2^56, so with totals up to 2^32 each step keeps >= 24 bits of precision and the rounding
// loss is below 2^-24 of a bit per symbol. A finished stream costs its symbols' information plus at
// most 2 bytes (the flush writes only the bytes needed to land inside the final interval).
// Everything is integer arithmetic: identical output on every machine.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace towers {

class RangeEncoder {
 public:
  static constexpr int kMaxTotalBits = 32;
  // Codes the symbol occupying [cum, cum + freq) of a table totalling 2^total_bits.
  // Requires freq >= 1, cum + freq <= 2^total_bits, 1 <= total_bits <= kMaxTotalBits (asserted).
  void encode(uint64_t cum, uint64_t freq, int total_bits);
  // Ends the stream and returns it (at least one byte). The encoder is then empty again.
  std::vector<uint8_t> finish();

 private:
  void shift_low();
  void put(uint8_t byte);
  unsigned __int128 low_ = 0;  // 64 bits plus the carry in bit 64
  uint64_t range_ = ~uint64_t{0};
  uint8_t cache_ = 0;          // the last byte not yet written (a carry may still reach it)
  uint64_t pending_ff_ = 0;    // 0xFF bytes after cache_ that a carry would turn into 0x00
  bool first_ = true;          // the very first cached byte is always 0 and is never written
  std::vector<uint8_t> out_;
};

class RangeDecoder {
 public:
  // Reads past the end of `bytes` as zeros (the encoder drops a trailing zero byte).
  explicit RangeDecoder(std::span<const uint8_t> bytes);
  // The position of the next symbol within [0, 2^total_bits): find the symbol whose
  // [cum, cum + freq) contains it, then call consume(cum, freq). Returns false when the stream cannot
  // have come from a table with this total (corrupt input); the decoder is then unusable.
  bool target(int total_bits, uint64_t& slot);
  void consume(uint64_t cum, uint64_t freq);
  // Bytes read beyond the end of the input. More than 8 means the stream is corrupt or truncated.
  uint64_t overrun() const { return overrun_; }

 private:
  uint8_t next();
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  uint64_t overrun_ = 0;
  uint64_t code_ = 0;   // the stream's value minus the encoder's low, within [0, range_)
  uint64_t range_ = ~uint64_t{0};
  uint64_t step_ = 0;   // range_ >> total_bits of the symbol being decoded
};

}  // namespace towers
