// Modular placement of segments (Prompt Cache / CacheBlend style): APPROXIMATE, explicit opt-in only.
//
// An exact segment is valid only under the parent chain it was computed under (segment.h, the pool's
// exact mode). A *modular* segment is computed once right after BOS, with no parent (its first token
// at position 1), and may then be placed under any prefix: the tower gives it a RoPE shift (its keys
// act where they are placed, KvSpan::rope_delta), but its keys and values still encode a context of
// "BOS + itself" instead of "prefix + itself". That error is what this file measures and repairs:
//   repair = 0   Prompt Cache: every row of the segment is reused as computed.
//   repair = r   CacheBlend-style: the first r tokens are prefilled again in the new context (they carry
//                most of the cross-attention to the prefix, and act as the segment's attention sink);
//                rows r.. are the cached ones, shifted. repair >= length() is an ordinary prefill.
// Quality (tests/test_modular.cc, docs/towers.md): measured as KL divergence of next-token
// distributions against monolithic prefill. Nothing in the pool or the daemon calls this silently.
#pragma once
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/model/forward.h"
#include "engine/model/segment.h"

namespace towers {

// Rows [from, to) of a segment as a segment of their own (0 <= from < to <= length()): same format,
// same key channel scales, same bytes for those rows, computed at seg.computed_pos() + from. The parent
// is kept (the rows were computed under the parent chain plus seg's first `from` tokens).
std::shared_ptr<const Segment> slice_segment(const Segment& seg, int32_t from, int32_t to, SegmentId new_id);

// A position-independent segment: `tokens` prefilled after BOS alone (position 1, parent none).
class ModularSegment {
 public:
  // Runs BOS + tokens through the model (one prefill) and keeps the tokens' rows in `format`.
  static Result<std::shared_ptr<const ModularSegment>> compute(Forward& forward, const ModelConfig& config,
                                                               int32_t bos, std::vector<int32_t> tokens,
                                                               KvQuant format, SegmentId id);

  // An exact segment computed under one parent chain, reused under another (its parent was edited,
  // or it is linked under a second parent): the same placement, with the old context's error instead
  // of "BOS alone" (docs/towers.md, "Edited parents").
  static std::shared_ptr<const ModularSegment> reuse(std::shared_ptr<const Segment> segment);

  const std::shared_ptr<const Segment>& segment() const { return segment_; }
  int32_t length() const { return segment_->length(); }
  // Rows [r, length()) (r < length()), cut once per r and shared by every placement that repairs r
  // tokens: per placement only the r repaired rows are new. r = 0 is segment() itself. Thread-safe.
  std::shared_ptr<const Segment> rest(int32_t r) const;

 private:
  explicit ModularSegment(std::shared_ptr<const Segment> segment) : segment_(std::move(segment)) {}
  std::shared_ptr<const Segment> segment_;
  mutable std::mutex mu_;
  mutable std::unordered_map<int32_t, std::shared_ptr<const Segment>> rest_;
};

struct ModularPlacement {
  int32_t repair = 0;            // first tokens of the segment prefilled again in context (0: none)
  std::optional<KvQuant> repair_format;  // of the repaired rows; default: the modular segment's format
  SegmentId repair_id = 0;       // id of the segment holding the repaired rows
  int32_t tail_capacity = 256;   // room for the session's own tokens after the placed segment
};

// A tower of `prefix` (exact segments, root first, usually beginning with BOS), then `modular` placed
// right after them: its first `repair` tokens prefilled in context (one prefill of `repair` tokens,
// sealed into a segment of their own), its remaining rows reused with a RoPE shift, then an empty tail.
// The result is approximate unless repair >= modular.length() (then it is exact, up to the formats).
// Errors: a failed prefill (context full, bad token).
Result<std::unique_ptr<Tower>> place_modular(Forward& forward, const ModelConfig& config,
                                             std::vector<std::shared_ptr<const Segment>> prefix,
                                             const ModularSegment& modular, const ModularPlacement& placement);

}  // namespace towers
