#include "engine/generate.h"

#include <algorithm>
#include <chrono>

#include "engine/tokenizer.h"

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

  Sampler sampler(options.sampling);
  StopMatcher stops(options.stop);
  Detokenizer detok(tokenizer);
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  auto emit = [&](const std::string& text) { return text.empty() || on_text(text); };

  t0 = std::chrono::steady_clock::now();
  r.finish_reason = "length";
  for (int i = 0; i < options.max_tokens; ++i) {
    const int32_t id = sampler.sample(logits, history);
    if (tokenizer.is_end_of_generation(id)) {
      r.finish_reason = "eos";
      break;
    }
    r.tokens.push_back(id);
    history.push_back(id);
    StopMatcher::Output step = stops.feed(detok.feed(id));
    if (!emit(step.text)) {
      r.finish_reason = "cancelled";
      break;
    }
    if (step.stopped) {
      r.finish_reason = "stop";
      break;
    }
    if (i + 1 == options.max_tokens) break;
    if (cache.size() >= cache.capacity()) {
      r.finish_reason = "context";
      break;
    }
    if (auto s = forward.eval(cache, std::span<const int32_t>(&id, 1), Logits::Last, logits); !s) return s;
  }
  if (r.finish_reason != "stop" && r.finish_reason != "cancelled") {
    StopMatcher::Output tail = stops.feed(detok.flush());
    std::string rest = tail.text + (tail.stopped ? "" : stops.flush());
    emit(rest);
  }
  r.decode_seconds = seconds_since(t0);
  return r;
}

}  // namespace towers
