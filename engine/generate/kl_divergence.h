// KL divergence of a model against a base model's log-probabilities, as llama.cpp's
// `llama-perplexity --kl-divergence` computes it: the check its users run on every quantization.
// The base is the file `llama-perplexity --kl-divergence-base FILE` writes (its "_logits_" format).
#pragma once
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "engine/base/status.h"
#include "engine/base/thread_pool.h"
#include "engine/model/forward.h"
#include "engine/model/model.h"

namespace towers {

// llama.cpp's logits file (examples/perplexity/perplexity.cpp, perplexity() and kl_divergence()):
//   "_logits_", int32 n_ctx, int32 n_vocab, int32 n_chunk, int32 tokens[n_chunk * n_ctx],
//   then per chunk, for each of its positions n_ctx/2 .. n_ctx-2 (the rows that predict the token after
//   them), one row of row_stride() uint16: float scale and float min_log_prob in the first four, then
//   the quantized log-probabilities, log p(i) = scale * q[i] + min_log_prob (the row's minimum is
//   clamped to max - 16, so q = 0 means "at most that").
// The chunk's first token is stored as read from the text; llama.cpp evaluates BOS in its place when
// the vocabulary adds one.
class BaseLogProbsFile {
 public:
  // Opens the file and reads its header and tokens; refuses a file that is not one, or whose size is
  // not exactly what its header says (a truncated or padded file).
  static Result<BaseLogProbsFile> open(const std::string& path);

  int n_ctx() const { return n_ctx_; }
  int n_vocab() const { return n_vocab_; }
  int n_chunk() const { return n_chunk_; }
  int first_scored() const { return n_ctx_ / 2; }                 // the first row's position in a chunk
  int rows_per_chunk() const { return n_ctx_ - 1 - n_ctx_ / 2; }
  int row_stride() const { return 2 * ((n_vocab_ + 1) / 2) + 4; }  // in uint16
  const std::vector<int32_t>& tokens() const { return tokens_; }   // n_chunk * n_ctx

  // Reads chunk `chunk`'s rows (rows_per_chunk() * row_stride() uint16) into `rows`.
  Status read_chunk(int chunk, std::vector<uint16_t>& rows);

  // Checks the file against a model: the same vocabulary size, every token inside it.
  Status check_matches(const ModelConfig& config) const;

 private:
  std::string path_;
  std::ifstream in_;
  int n_ctx_ = 0, n_vocab_ = 0, n_chunk_ = 0;
  std::vector<int32_t> tokens_;
  uint64_t rows_offset_ = 0;
};

// One row of the comparison: the model's logits against the base's quantized log-probabilities of the
// same position (llama.cpp's log_softmax(..., kl_divergence_result&)).
struct KlRow {
  double kld = 0;          // sum_i p_base(i) * (log p_base(i) - log p(i)), over p_base's log > -16
  double nll = 0;          // -log p(next token), this model
  double nll_base = 0;     // -log p_base(next token)
  bool same_top = false;   // argmax of this model's logits == argmax of the base's row
};
KlRow compare_row(const float* logits, const uint16_t* base_row, int n_vocab, int next_token);

struct KlDivergenceResult {
  std::vector<KlRow> rows;  // every scored position, chunk after chunk
  int chunks = 0;

  size_t count() const { return rows.size(); }
  // Mean and llama.cpp's uncertainty (standard error, 0 for fewer than 11 values).
  std::pair<double, double> mean_kld() const;
  std::pair<double, double> mean_nll() const;
  std::pair<double, double> mean_nll_base() const;
  std::pair<double, double> mean_p_diff() const;  // p(next) - p_base(next)
  double rms_p_diff() const;
  double same_top_share() const;  // 0..1
  // The p-th quantile (0..1) of the per-token KL values, interpolated as llama.cpp does.
  double kld_quantile(double p) const;
};

struct KlDivergenceOptions {
  int batch = 512;  // tokens per forward call
  Kernels kernels = Kernels::Fast;
  // Called after each chunk with the rows so far (for a progress line).
  std::function<void(int chunk, int n_chunk, const KlDivergenceResult&)> on_chunk;
};

// Evaluates every chunk of `base` with `model` (BOS in place of the first token when the vocabulary
// adds one, as llama.cpp does) and compares its scored rows with the base's. The file must match the
// model (check_matches). Sums are taken in token order, so the result does not depend on threads.
Result<KlDivergenceResult> kl_divergence(const Model& model, ThreadPool& pool, BaseLogProbsFile& base,
                                         const KlDivergenceOptions& options);

}  // namespace towers
