// Scoring a text: the model's negative log-likelihood of every token given the ones before it.
#pragma once
#include <functional>
#include <string_view>

#include "engine/model/model.h"
#include "engine/base/status.h"
#include "engine/base/thread_pool.h"

namespace towers {

class Forward;

struct PerplexityOptions {
  int window = 0;  // tokens per window; 0 = the model's training context
  int batch = 512;  // tokens per forward call
  // Called once on the Forward that scores the text (e.g. oneDNN prefill and its int8 attention).
  std::function<void(Forward&)> configure_forward;
  std::function<void(int done, int total)> progress;
};

struct PerplexityResult {
  int tokens = 0;            // including the leading BOS
  int predicted = 0;         // tokens scored (every token but the first of each window)
  double total_nll_nats = 0;
  double mean_nll_nats() const { return predicted ? total_nll_nats / predicted : 0.0; }
};

// Tokenizes `text` with BOS first and sums -log p(token | previous tokens of its window).
Result<PerplexityResult> perplexity(const Model& model, ThreadPool& pool, std::string_view text,
                                    const PerplexityOptions& options);
// -log softmax(logits)[token], computed in double.
double token_nll(const float* logits, int n_vocab, int token);

}  // namespace towers
