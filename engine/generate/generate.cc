#include "engine/generate/generate.h"

#include <algorithm>
#include <chrono>

#include "engine/generate/decoder.h"
#include "engine/text/tokenizer.h"

namespace towers {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Result<GenerateResult> generate(Forward& forward, KvCache& cache, const Tokenizer& tokenizer,
                                std::span<const int32_t> prompt, const GenerateOptions& options,
                                const std::function<bool(std::string_view)>& on_text) {
  if (prompt.empty()) return Status::Error("empty prompt: at least one token (e.g. BOS) is needed");
  GenerateResult r;
  r.prompt_tokens = static_cast<int>(prompt.size());
  std::vector<float> logits;

  auto t0 = std::chrono::steady_clock::now();
  const size_t batch = static_cast<size_t>(std::max(1, options.prefill_batch));
  for (size_t b = 0; b < prompt.size(); b += batch) {
    auto chunk = prompt.subspan(b, std::min(batch, prompt.size() - b));
    if (auto s = forward.eval(cache, chunk, Logits::Last, logits); !s) return s;
  }
  r.prefill_seconds = seconds_since(t0);

  auto emit = [&](const std::string& text) { return text.empty() || on_text(text); };
  t0 = std::chrono::steady_clock::now();
  r.finish_reason = FinishReason::Length;
  if (options.max_tokens > 0) {
    Decoder decoder(tokenizer, options.sampling, options.stop, prompt, options.max_tokens, options.constraint);
    for (;;) {
      Decoder::Step step = decoder.step(logits, cache.size() >= cache.capacity());
      if (!emit(step.text)) {
        r.finish_reason = FinishReason::Cancelled;
        break;
      }
      if (step.done) {
        r.finish_reason = step.finish_reason;
        break;
      }
      if (auto s = forward.eval(cache, std::span<const int32_t>(&step.token, 1), Logits::Last, logits); !s) return s;
    }
    r.tokens = decoder.tokens();
    if (keeps_held_text(r.finish_reason)) emit(decoder.flush());
  } else {
    emit(Decoder(tokenizer, options.sampling, options.stop, prompt, 1).flush());
  }
  r.decode_seconds = seconds_since(t0);
  return r;
}

}  // namespace towers
