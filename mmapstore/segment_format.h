// Segment files (.tws): the on-disk form of one segment, laid out exactly as attention reads it, so
// the pool maps the file read-only and serves the mapped bytes in place (mmapstore/segment_file.h).
//
// File layout, version 2 (every integer little-endian; x86-64 and ARM64 both are):
//
//   offset 0            Header, 152 bytes (below; `flags` was a reserved zero byte before, so
//                       files without flags read as flags 0 and the version stays 2)
//   tokens_offset       int32 tokens[n_tokens]
//   k_offset            K: [layer][row][kv head] vectors in `format`, kv_bytes bytes       (64-aligned)
//   v_offset            V: the same shape, kv_bytes bytes                                  (64-aligned)
//   scales_offset       float key scales [layer][kv head][head_dim], n_scales of them      (64-aligned)
//   file_bytes          = scales_offset + 4 * n_scales; nothing follows
//
// Gaps between sections are zero. Offsets are stored (not derived) and checked: ascending,
// 64-byte aligned, non-overlapping, inside the file.
//
// Checks, and when they run:
//   at open (start-up cost O(1) per file: the header and the tokens only, read ahead for all files first)
//     magic, version, header_xxh3, model fingerprint, model shape, offsets and sizes against the file
//     length, and against what the record log says of the segment: id, parent, computed position,
//     format, token count, tokens_xxh3 (the tokens the log holds) and context_xxh3 (the tokens of the
//     parent chain it was computed under, positions 0 .. computed_pos);
//   before first use (its first page-in; a file just written: right after the write)
//     payload_xxh3 over every byte from tokens_offset to the end.
// A file failing any check is never served: the segment is recomputed and the file replaced.
//
// Writes: the whole file goes to "<name>.tmp", is synced, renamed, and the directory synced
// (mmapstore/posix_file.h), so a crash leaves no file or a whole one; a stray .tmp is removed at start.
#pragma once
#include <cstddef>
#include <cstdint>

namespace towers::segment_format {

inline constexpr char kMagic[8] = {'T', 'W', 'R', 'S', 'E', 'G', '\n', '\0'};
inline constexpr uint32_t kVersion = 2;
inline constexpr uint64_t kSectionAlign = 64;
inline constexpr uint64_t kMaxFileBytes = uint64_t{1} << 40;  // refuse anything larger (1 TiB)

struct Header {
  char magic[8];
  uint32_t version;
  uint8_t format;               // simd::KvQuant
  uint8_t flags;                // kFlag* below (0 in files of towerd before it: a reserved byte)
  uint8_t reserved0[2];
  uint64_t model_fingerprint;   // engine/codec/codec.h model_fingerprint()
  uint64_t id, parent;          // pool ids (0 = no parent)
  int32_t computed_pos;         // position of the first token when computed (= parent chain length)
  uint32_t n_layer, n_head_kv, head_dim;
  uint64_t n_tokens;
  uint64_t kv_bytes;            // bytes of K, and of V
  uint64_t n_scales;            // floats of key scales
  uint64_t tokens_offset, k_offset, v_offset, scales_offset;
  uint64_t file_bytes;
  uint64_t tokens_xxh3;         // XXH3-64 of the tokens' bytes
  uint64_t context_xxh3;        // XXH3-64 of the parent chain's tokens' bytes (0 tokens: of nothing)
  uint64_t payload_xxh3;        // XXH3-64 of bytes [tokens_offset, file_bytes)
  uint64_t header_xxh3;         // XXH3-64 of every byte above
};
static_assert(sizeof(Header) == 152, "the header layout is part of the file format");
static_assert(offsetof(Header, header_xxh3) == sizeof(Header) - 8, "header_xxh3 comes last");

// The KV is not what a prefill of the tokens after the parent chain gives: it is a RoPE-shifted
// copy of rows computed under a longer context (a session's kept turns after older ones were
// dropped). Such a segment cannot be recomputed from the log: it never goes to the cold tier, and a
// record names it only once its file is durable (docs/store.md).
inline constexpr uint8_t kFlagDerived = 1;
// The KV is a modular placement (engine/model/modular.h): the rows of the same tokens computed under
// another parent chain (before the parent was edited), RoPE-shifted, with their first tokens
// recomputed. Approximate, but a prefill gives the exact KV back: a restart queues that rebuild.
inline constexpr uint8_t kFlagModular = 2;

inline constexpr uint64_t align_up(uint64_t n) { return (n + kSectionAlign - 1) / kSectionAlign * kSectionAlign; }

}  // namespace towers::segment_format
