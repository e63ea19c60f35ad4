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
// (docs/numerics.md). The container (magic, version, model fingerprint, chunk table, CRCs) is
// described in docs/codec.md; decoding verifies it and returns an error, never wrong tokens.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/forward.h"
#include "engine/model.h"
#include "engine/status.h"

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
inline constexpr uint8_t kVersion = 1;
inline constexpr int kFreqBits = 31;  // every table totals 2^31
inline constexpr int32_t kDefaultWindowCap = 4096;
inline constexpr int64_t kMaxTokens = int64_t{1} << 26;  // per container

// Quantises a next-token distribution to integer frequencies: freq[i] >= 1, sum == 2^kFreqBits.
// Integer-only after one exact float subtraction (fixed-point exp, docs/codec.md), so the same logits
// give the same table on every machine. NaN/inf logits are tolerated.
void frequencies(std::span<const float> logits, std::vector<uint32_t>& freq);

// CRC-32 (IEEE 802.3, zlib's) of bytes, continuing from `crc` (0 to start).
uint32_t crc32(std::span<const uint8_t> bytes, uint32_t crc = 0);
uint32_t crc32_tokens(std::span<const int32_t> tokens);  // of the little-endian int32 bytes
}  // namespace codec

struct CodecOptions {
  int32_t chunk = 0;   // encode: tokens per independently decodable chunk; 0 = one chunk for all
  int32_t window = 0;  // encode: most tokens the model attends to at once (recorded in the container);
                       // 0 = min(n_ctx_train, kDefaultWindowCap)
  int32_t batch = 32;  // chunks evaluated together per step (encode and decode)
  std::function<void(int64_t done, int64_t total)> progress;  // tokens coded / decoded so far
};

struct CodecStats {
  int64_t tokens = 0;
  int32_t chunks = 0;
  size_t bytes = 0;     // container size
  double nll_bits = 0;  // encode: the model's NLL of the tokens under the coder's own conditioning
  double seconds = 0;   // time spent in encode/decode
};

// A container's header, readable without a model (towerctl codec info, the store).
struct CodecHeader {
  uint8_t version = 0;
  Kernels kernels = Kernels::Fast;
  uint64_t fingerprint = 0;
  uint16_t target_tag = 0;       // low 16 bits of CRC-32 of the encoder's SIMD target name
  int32_t window = 0;
  int64_t context_length = 0;    // tokens of the parent chain the segment was coded under
  uint32_t context_crc = 0;
  int64_t tokens = 0;
  int32_t chunk = 0;             // tokens per chunk (the last may be shorter); 0 when tokens == 0
  std::vector<uint32_t> chunk_bytes;  // coded bytes of each chunk, in order
  uint32_t tokens_crc = 0;
  size_t header_bytes = 0;       // where the chunk streams start (they end 4 bytes before the end)
};
// Checks the container CRC (the last 4 bytes, over everything before them), then parses and checks
// the header: magic, version, every size against the input length. Needs no model.
Result<CodecHeader> read_codec_header(std::span<const uint8_t> bytes);
// The tag recorded for this machine's SIMD target.
uint16_t codec_target_tag();

class Codec {
 public:
  explicit Codec(const Model& model, ThreadPool* pool = nullptr);  // computes the fingerprint
  Codec(const Model& model, uint64_t fingerprint);                // when it is known already
  uint64_t fingerprint() const { return fingerprint_; }

  // `forward` must run this codec's model; its kernel set is recorded. `context` is what the model
  // sees before the first token (the parent chain); empty means "start of text" (BOS if the vocab has
  // one). Only its last window/2 tokens are used; its length and CRC are recorded and checked.
  Result<std::vector<uint8_t>> encode(Forward& forward, std::span<const int32_t> context,
                                      std::span<const int32_t> tokens, const CodecOptions& options = {},
                                      CodecStats* stats = nullptr) const;
  // The same context must be given. Errors for another model (fingerprint), another kernel set,
  // another context, and any corruption (CRC of the header and of the decoded tokens).
  Result<std::vector<int32_t>> decode(Forward& forward, std::span<const int32_t> context,
                                      std::span<const uint8_t> bytes, const CodecOptions& options = {},
                                      CodecStats* stats = nullptr) const;

 private:
  const Model& model_;
  uint64_t fingerprint_;
};

}  // namespace towers
