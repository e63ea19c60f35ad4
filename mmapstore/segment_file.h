// Segment files: writing one (through the file seam, crash-safe), and opening one as a read-only
// mapping that a Segment reads in place. The format, and which check runs when, is in
// mmapstore/segment_format.h.
#pragma once
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/model/segment.h"
#include "mmapstore/posix_file.h"
#include "mmapstore/segment_format.h"

namespace towers {

// 64-bit XXH3 of a byte range (checksums, fingerprints).
uint64_t xxh3_64(std::span<const uint8_t> bytes, uint64_t seed = 0);
uint64_t xxh3_tokens(std::span<const int32_t> tokens);  // of the tokens' little-endian bytes

// The whole file in memory (tests, tools). context_xxh3: xxh3_tokens of the parent chain's tokens.
// flags: segment_format::kFlag* (the header's flags byte).
std::vector<uint8_t> encode_segment(const Segment& segment, uint64_t model_fingerprint, uint64_t context_xxh3,
                                    uint8_t flags = 0);

// Appends the whole file's bytes to `file` (the writer batches its syncs and renames itself).
Status append_segment(WritableFile& file, const Segment& segment, uint64_t model_fingerprint, uint64_t context_xxh3,
                      uint8_t flags = 0);
// Writes the file atomically (mmapstore/posix_file.h write_file_atomic).
Status write_segment_file(FileSystem& fs, const Segment& segment, const std::filesystem::path& path,
                          uint64_t model_fingerprint, uint64_t context_xxh3, uint8_t flags = 0);

// What the record log knows of a segment; opening a file checks its header against it.
struct SegmentExpect {
  SegmentId id = 0, parent = 0;
  int32_t computed_pos = 0;
  std::span<const int32_t> tokens;
  uint64_t context_xxh3 = 0;
  std::optional<KvQuant> format;  // unset: any format
};

// An open segment file: a read-only shared mapping of the whole file.
class SegmentFile : public std::enable_shared_from_this<SegmentFile> {
 public:
  // Maps the file and runs the open-time checks (header, sizes, fingerprint, shape, and `expect`
  // when given). Corruption for a bad file, IOError when it cannot be read, NotFound when absent.
  static Result<std::shared_ptr<SegmentFile>> open(const std::filesystem::path& path, const ModelConfig& config,
                                                   uint64_t model_fingerprint, const SegmentExpect* expect = nullptr);
  ~SegmentFile();
  SegmentFile(const SegmentFile&) = delete;
  SegmentFile& operator=(const SegmentFile&) = delete;

  const segment_format::Header& header() const { return header_; }
  const std::filesystem::path& path() const { return path_; }
  uint64_t file_bytes() const { return size_; }
  std::span<const int32_t> tokens() const;

  // The payload checksum, computed once (it reads every byte: it also brings them into memory).
  Status verify();
  bool verified() const { return verified_.load(std::memory_order_acquire); }

  // A segment over the mapped bytes (no copy); it keeps this file mapped while it lives.
  Result<std::shared_ptr<const Segment>> segment(const ModelConfig& config);

  // Paging: populate() faults every page in before a step needs them (MADV_POPULATE_READ, or
  // MADV_WILLNEED plus a read of each page where the kernel lacks it); release() drops this
  // mapping's pages (MADV_DONTNEED; the page cache may keep them); resident_bytes() asks mincore.
  void populate();
  void release();
  size_t resident_bytes() const;

 private:
  SegmentFile() = default;
  std::filesystem::path path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  segment_format::Header header_{};
  std::atomic<bool> verified_{false};
};

}  // namespace towers
