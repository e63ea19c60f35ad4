#include "engine/generate/perplexity.h"

#include <algorithm>
#include <cmath>

#include "engine/model/forward.h"
#include "engine/text/tokenizer.h"

namespace towers {

double token_nll(const float* logits, int n_vocab, int token) {
  float mx = *std::max_element(logits, logits + n_vocab);
  double sum = 0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  return std::log(sum) - (static_cast<double>(logits[token]) - mx);
}

Result<PerplexityResult> perplexity(const Model& model, ThreadPool& pool, std::string_view text,
                                    const PerplexityOptions& options) {
  const ModelConfig& cfg = model.config();
  std::vector<int32_t> ids = model.tokenizer().encode(text, /*add_bos=*/true, /*parse_special=*/false);
  if (ids.size() < 2) return Status::Error("text too short: need at least one token after BOS");
  const int window = options.window > 0 ? options.window : cfg.n_ctx_train;
  if (window < 2) return Status::Error("window must hold at least 2 tokens");
  const int batch = std::max(1, options.batch);

  PerplexityResult r;
  r.tokens = static_cast<int>(ids.size());
  Forward fwd(model, pool);
  if (options.configure_forward) options.configure_forward(fwd);
  std::vector<float> logits;
  for (size_t w0 = 0; w0 < ids.size(); w0 += window) {
    const size_t w1 = std::min(ids.size(), w0 + window);
    DenseKvCache cache(cfg, static_cast<int32_t>(w1 - w0));
    for (size_t b0 = w0; b0 < w1; b0 += batch) {
      const size_t b1 = std::min(w1, b0 + batch);
      std::span<const int32_t> chunk(ids.data() + b0, b1 - b0);
      if (auto s = fwd.eval(cache, chunk, Logits::All, logits); !s) return s;
      // Row i predicts token b0+i+1 when that token is still inside this window.
      for (size_t i = 0; i < chunk.size(); ++i) {
        const size_t next = b0 + i + 1;
        if (next >= w1) break;
        r.total_nll_nats += token_nll(&logits[i * cfg.n_vocab], cfg.n_vocab, ids[next]);
        ++r.predicted;
      }
      if (options.progress) options.progress(static_cast<int>(b1), r.tokens);
    }
  }
  return r;
}

}  // namespace towers
