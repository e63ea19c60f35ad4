// The generation loop: prefill a prompt, then sample token by token until a limit, an end-of-generation
// token or a stop string, streaming valid UTF-8 text to a callback.
#pragma once
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/forward.h"
#include "engine/constrained/grammar_matcher.h"
#include "engine/generate/finish_reason.h"
#include "engine/generate/sampler.h"

namespace towers {

struct GenerateOptions {
  int max_tokens = 256;
  SamplerConfig sampling;
  std::vector<std::string> stop;  // stop strings: generation ends before them, they are not emitted
  int prefill_batch = 512;        // prompt tokens per forward call
  GrammarConstraint* constraint = nullptr;  // optional, not owned: constrained decoding (decoder.h)
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (without the end-of-generation token)
  FinishReason finish_reason = FinishReason::Length;  // Length, Eos, Stop, Context, Grammar, Cancelled
  int prompt_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

// on_text gets each newly complete piece of text; returning false cancels generation.
// The cache must have room for the prompt; generation stops with "context" when it is full.
Result<GenerateResult> generate(Forward& forward, KvCache& cache, const Tokenizer& tokenizer,
                                std::span<const int32_t> prompt, const GenerateOptions& options,
                                const std::function<bool(std::string_view)>& on_text);

}  // namespace towers
