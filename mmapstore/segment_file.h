// Segment files: the warm tier. A segment's quantized K/V bytes, exactly as held in RAM, in one file
// with a checksummed header, so paging it back in is one read and a check, never a prefill.
//
// Layout (little-endian; x86-64 and ARM64 both are):
//   header   SegmentFileHeader (fixed size, its own XXH3 checksum last)
//   payload  tokens (int32 x n_tokens) | K bytes | V bytes | key scales (float x n_scales)
// The payload has its own XXH3 checksum in the header. A reader checks magic, version, the header
// checksum, the model fingerprint, that the sizes agree with each other, with the model's shape and
// with the file's length (before allocating anything), then the payload checksum. Any mismatch is an
// error naming the file and the reason; a bad file is never turned into a segment.
//
// Writes are crash-safe: write to "<path>.tmp", fsync, rename over <path>, fsync the directory. A crash
// leaves either the old file or the new one, plus at worst a stray .tmp that readers ignore.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/segment.h"

namespace towers {

inline constexpr uint32_t kSegmentFileVersion = 1;

// 64-bit XXH3 of a byte range (checksums, fingerprints).
uint64_t xxh3_64(std::span<const uint8_t> bytes, uint64_t seed = 0);

// Serialized form of a segment (header + payload), and back.
std::vector<uint8_t> encode_segment(const Segment& segment, uint64_t model_fingerprint);
Result<std::shared_ptr<const Segment>> decode_segment(const ModelConfig& config, std::span<const uint8_t> bytes,
                                                      uint64_t model_fingerprint);

Status write_segment_file(const Segment& segment, const std::filesystem::path& path, uint64_t model_fingerprint);

// Reads many files at once: io_uring (one submission for all of them) when the kernel allows it,
// pread otherwise. Each result is the file's bytes or why it could not be read.
class FileReader {
 public:
  explicit FileReader(unsigned queue_depth = 64);
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  bool uses_io_uring() const { return ring_ != nullptr; }
  std::vector<Result<std::vector<uint8_t>>> read_all(std::span<const std::filesystem::path> paths,
                                                     size_t max_bytes = size_t{1} << 34);

 private:
  struct Ring;
  std::unique_ptr<Ring> ring_;
};

Result<std::shared_ptr<const Segment>> read_segment_file(FileReader& reader, const ModelConfig& config,
                                                         const std::filesystem::path& path,
                                                         uint64_t model_fingerprint);

}  // namespace towers
