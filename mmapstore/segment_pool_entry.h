// The pool's record of one segment, shared by segment_pool.cc (the index, leases, installs) and
// segment_pool_tiers.cc (moving segments between hot, warm and cold). Private to the pool.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "mmapstore/segment_file.h"
#include "mmapstore/rest_table.h"
#include "mmapstore/segment_pool.h"

namespace towers {

struct SegmentPool::Entry {
  SegmentId id = kNoSegment, parent = kNoSegment;
  int32_t length = 0, computed_pos = 0;
  KvQuant format = KvQuant::F32;
  size_t kv_bytes = 0;                      // of its KV once computed
  std::shared_ptr<const Segment> segment;   // hot: owned RAM or a view of `file`; null otherwise
  std::shared_ptr<SegmentFile> file;        // the mapping `segment` reads, while hot from the file
  bool durable = false;                     // the store file is written and synced
  uint64_t file_bytes = 0;                  // its size, when durable
  bool verified = false;                    // its payload checksum passed in this process
  bool writing = false;                     // queued at the writer
  bool loading = false;                     // a page_in maps it right now (without the lock)
  bool derived = false;                     // SegmentInfo::derived
  SegmentId derive_from = kNoSegment;       // cold: computed as rows of this segment, shifted
  int32_t derive_skip = 0;                  // ... from this row of it
  bool modular = false;                     // SegmentInfo::modular (meaningless while cold)
  std::vector<SegmentId> modular_from;      // cold: a modular build reuses these segments' rows
  int32_t repair = 0;                       // ... after prefilling this many of its tokens
  std::vector<uint8_t> coded;               // cold: the compressor's coded tokens
  // Its record is durable in the cold packs (mmapstore/cold_pack.h). Valid for as long as the segment
  // lives (its tokens never change): going to rest again appends nothing. (At rest a segment is not
  // an Entry at all but a RestRecord: mmapstore/rest_table.h.)
  bool packed = false;
  uint32_t pack = 0, pack_length = 0, pack_crc = 0;
  uint64_t pack_offset = 0;
  bool has_record() const { return !coded.empty() || packed; }
  std::string label;
  std::string lineage;                      // SegmentOptions::lineage
  bool pinned = false;
  uint64_t hits = 0;
  std::chrono::steady_clock::time_point created, last_used;

  Tier tier() const { return segment ? Tier::Hot : durable ? Tier::Warm : Tier::Cold; }
  bool owned() const { return segment && !file; }
  // What it holds in memory: the KV it owns, or its mapped file.
  size_t resident_bytes() const { return !segment ? 0 : file ? file_bytes : kv_bytes; }
};

}  // namespace towers
