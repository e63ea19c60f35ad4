// The cold-tier codec: a segment's tokens arithmetic-coded against the model's own next-token
// distribution, conditioned on the tokens before the segment (its parent chain). A segment then costs
// about its conditional surprisal: ~2-5 bits per token instead of kilobytes of KV.
//
//   Codec codec(model);                                  // hashes the model once (its fingerprint)
//   auto bytes = codec.encode(forward, parents, tokens); // Result<std::vector<uint8_t>>
//   auto back  = codec.decode(forward, parents, *bytes); // Result<std::vector<int32_t>>, == tokens
//
// The tokens are cut into chunks of `chunk` tokens, each coded as an independent stream conditioned on
// the parents and its own earlier tokens only, so the decoder runs many chunks as one batch
// (Forward::eval_batch: a GEMM-shaped step instead of one GEMV per token). Frequency tables are
// integer-only functions of the logits, which are bit-identical for any thread count and batch shape
// (docs/numerics.md).
//
// Bytes (docs/codec.md): what every segment of a store shares (model fingerprint, kernel set, SIMD
// target, window) is a 24-byte *store header* written once; each segment is a *record* of its coded
// streams plus 2 bytes (a 15-bit check of its tokens and a flag for a chunk table). What the store
// knows about a segment anyway — its token count and its parent chain — stays in the store's index
// (CodecSegmentKey). A standalone file (towerctl codec, the daemon's state log) is store header + key
// + record + CRC-32. Decoding checks everything it is given and returns an error, never wrong tokens.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/model/forward.h"
#include "engine/model/model.h"
#include "engine/base/status.h"

namespace towers {

// 64-bit hash of everything that determines a model's logits and vocabulary: every tensor (name, type,
// shape, bytes) and every metadata key except general.* (names, licences; general.architecture is
// kept) and tokenizer.chat_template*. Tensors are hashed in parallel on `pool` when given; the result
// does not depend on it.
uint64_t model_fingerprint(const Model& model, ThreadPool* pool = nullptr);

// An error unless `coder` can code `serving`'s tokens (a smaller coder model): same vocabulary size and
// the same token texts.
Status check_same_vocabulary(const Model& serving, const Model& coder);

namespace codec {
inline constexpr uint8_t kVersion = 2;
inline constexpr int kFreqBits = 31;  // every table totals 2^31
inline constexpr int32_t kDefaultWindowCap = 4096;
inline constexpr int64_t kMaxTokens = int64_t{1} << 26;  // per record
inline constexpr size_t kStoreHeaderBytes = 24;
inline constexpr int kCheckBits = 15;  // of a record's tokens

// Quantises a next-token distribution to integer frequencies: freq[i] >= 1, sum == 2^kFreqBits.
// Integer-only after one exact float subtraction (fixed-point exp, docs/codec.md), so the same logits
// give the same table on every machine. NaN/inf logits are tolerated.
void frequencies(std::span<const float> logits, std::vector<uint32_t>& freq);

// CRC-32 (IEEE 802.3, zlib's) of bytes, continuing from `crc` (0 to start).
uint32_t crc32(std::span<const uint8_t> bytes, uint32_t crc = 0);
uint32_t crc32_tokens(std::span<const int32_t> tokens);  // of the little-endian int32 bytes
// A record's check of its tokens: the low kCheckBits bits of crc32_tokens.
uint16_t tokens_check(std::span<const int32_t> tokens);
}  // namespace codec

struct CodecOptions {
  int32_t chunk = 0;   // encode: tokens per independently decodable chunk; 0 = one chunk for all
  int32_t window = 0;  // store_header / encode: most tokens the model attends to at once (recorded in
                       // the store header); 0 = min(n_ctx_train, kDefaultWindowCap)
  int32_t batch = 32;  // chunks evaluated together per step (encode and decode)
  // decode: also try bytes coded on a CPU with another SIMD target. Its logits almost surely differ
  // (docs/numerics.md), and the decode then fails the 15-bit tokens check, except with probability
  // 2^-15, when it would return wrong tokens; so by default such bytes are refused before decoding.
  bool any_target = false;
  std::function<void(int64_t done, int64_t total)> progress;  // tokens coded / decoded so far
};

struct CodecStats {
  int64_t tokens = 0;
  int32_t chunks = 0;
  size_t bytes = 0;         // what encode returned / decode was given (record or standalone container)
  size_t record_bytes = 0;  // the record alone: what one more segment costs a store
  double nll_bits = 0;      // encode: the model's NLL of the tokens under the coder's own conditioning
  double seconds = 0;       // time spent in encode/decode
};

// What every record of one store shares, written once per store (or at the head of a standalone
// file): kStoreHeaderBytes with their own CRC.
struct CodecStoreHeader {
  uint8_t version = codec::kVersion;
  Kernels kernels = Kernels::Fast;
  // The Forward's rounding the records were coded with (flags bit 1; stores written before
  // 2026-11-27 have F32); the codec's passes switch the Forward to it.
  Rounding rounding = Rounding::Ggml;
  // The Forward's packed kernel set (flags bits 2-3; stores written before it existed have 0, Classic).
  PackedSet packed_set = kLatestPackedSet;
  uint64_t fingerprint = 0;  // model_fingerprint of the coder model
  uint16_t target_tag = 0;   // codec_target_tag() of the encoder (named in errors when logits differ)
  int32_t window = 0;
};
std::vector<uint8_t> write_codec_store_header(const CodecStoreHeader& h);
// Parses and checks the first kStoreHeaderBytes of `bytes`: magic, version, CRC, flags, window.
Result<CodecStoreHeader> read_codec_store_header(std::span<const uint8_t> bytes);
// The tag recorded for this machine's SIMD target.
uint16_t codec_target_tag();
// What a tag names, for messages: "AVX3 (x86-64)", "NEON (ARM64)", ... for Highway's targets, whatever
// CPU reads the tag; "an unknown target" otherwise.
std::string codec_target_name(uint16_t tag);

// What a store keeps about a coded segment in its index rather than in the record. A store that
// identifies the parent chain otherwise (immutable parents by id) needs only `tokens` of it.
struct CodecSegmentKey {
  int64_t tokens = 0;          // the segment's token count
  int64_t context_length = 0;  // tokens of the parent chain it was coded under
  uint32_t context_crc = 0;    // crc32_tokens of that chain
  bool operator==(const CodecSegmentKey&) const = default;
};
CodecSegmentKey codec_segment_key(std::span<const int32_t> context, std::span<const int32_t> tokens);

// A record's layout, read without a model; `tokens` comes from the store's index.
struct CodecRecord {
  uint16_t tokens_check = 0;
  int32_t chunk = 0;                  // tokens per chunk (the last may be shorter); 0 when tokens == 0
  std::vector<uint32_t> chunk_bytes;  // coded bytes of each chunk, in order
  size_t header_bytes = 0;            // where the streams start (they run to the end of the record)
};
Result<CodecRecord> read_codec_record(std::span<const uint8_t> record, int64_t tokens);
// Without a model: whether `record` can be the coding of exactly `tokens` (it parses for their count
// and its check matches; a false "yes" for other tokens has probability 2^-15).
bool record_codes(std::span<const uint8_t> record, std::span<const int32_t> tokens);

// A standalone container: store header, key (varint tokens, varint context length, context CRC-32),
// record, CRC-32 of everything before it. `record` points into the bytes given.
struct CodecContainer {
  CodecStoreHeader store;
  CodecSegmentKey key;
  std::span<const uint8_t> record;
};
std::vector<uint8_t> write_codec_container(const CodecStoreHeader& store, const CodecSegmentKey& key,
                                           std::span<const uint8_t> record);
// Checks the container CRC first (any damage or truncation), then every field (sizes against the
// input, before anything is allocated). Needs no model.
Result<CodecContainer> read_codec_container(std::span<const uint8_t> bytes);

class Codec {
 public:
  explicit Codec(const Model& model, ThreadPool* pool = nullptr);  // computes the fingerprint
  Codec(const Model& model, uint64_t fingerprint);                // when it is known already
  uint64_t fingerprint() const { return fingerprint_; }

  // Standalone containers. `forward` must run this codec's model; its kernel set is recorded.
  // `context` is what the model sees before the first token (the parent chain); empty means "start of
  // text" (BOS if the vocab has one). Only its last window/2 tokens are used; its length and CRC are
  // recorded and checked.
  Result<std::vector<uint8_t>> encode(Forward& forward, std::span<const int32_t> context,
                                      std::span<const int32_t> tokens, const CodecOptions& options = {},
                                      CodecStats* stats = nullptr) const;
  // The same context must be given. Errors for another model (fingerprint), another kernel set,
  // another context, and any corruption (container CRC, the record's check of the decoded tokens).
  Result<std::vector<int32_t>> decode(Forward& forward, std::span<const int32_t> context,
                                      std::span<const uint8_t> bytes, const CodecOptions& options = {},
                                      CodecStats* stats = nullptr) const;

  // A store: one header for this model, `forward`'s kernel set and options.window; an error for a
  // window outside 2..the model's context.
  Result<CodecStoreHeader> store_header(const Forward& forward, const CodecOptions& options = {}) const;
  // One record under `store` (this model's, forward's kernels). The store keeps codec_segment_key
  // (or its own equivalent) in its index.
  Result<std::vector<uint8_t>> encode_record(Forward& forward, const CodecStoreHeader& store,
                                             std::span<const int32_t> context, std::span<const int32_t> tokens,
                                             const CodecOptions& options = {}, CodecStats* stats = nullptr) const;
  // `tokens` is the count from the store's index; the caller has checked that `context` is the chain
  // the record was coded under (the record does not hold it: another context fails the tokens check,
  // but only with probability 1 - 2^-15). The store's own checksums cover the record's bytes.
  Result<std::vector<int32_t>> decode_record(Forward& forward, const CodecStoreHeader& store,
                                             std::span<const int32_t> context, int64_t tokens,
                                             std::span<const uint8_t> record, const CodecOptions& options = {},
                                             CodecStats* stats = nullptr) const;

 private:
  Status check_store(const CodecStoreHeader& store, Kernels kernels) const;
  const Model& model_;
  uint64_t fingerprint_;
};

}  // namespace towers
