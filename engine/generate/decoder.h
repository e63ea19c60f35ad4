// One generation's token-by-token state: sampling, end-of-generation, stop strings and streaming
// UTF-8 text. generate() drives one Decoder over one cache; the daemon's scheduler drives many, one per
// sequence of a batched step, so both end generations by exactly the same rules:
//   - an end-of-generation token ends it (Eos; the token is not kept or printed);
//   - a stop string ends it (Stop; the text stops before it);
//   - the max_tokens-th token ends it (Length);
//   - a full cache ends it (Context);
//   - with a grammar constraint, no allowed token ends it (Grammar: the vocabulary cannot continue
//     the grammar, or its automaton hit its limit; grammar_status() says which). A complete grammar
//     with nothing left to add ends it as Eos even when the vocabulary has no end token.
// A constraint (engine/constrained/grammar_matcher.h) masks the logits before sampling, so the sampler only sees
// allowed tokens (end-of-generation ones only where the grammar is complete), and advances with each
// sampled token. Without one, nothing changes: the same logits reach the sampler.
// With sampling.logprobs >= 0 it also reports each kept token's logprobs (Sampler::logprobs, with the
// tokens' bytes), released in step with the text: take_logprobs() gives the tokens whose text has all
// been handed out (by step() or flush()), so a streamed chunk carries the tokens of its own text.
// After a stop string, tokens that lie wholly inside it are dropped, like their text. A grammar's mask
// is part of the processed logits the logprobs come from.
#pragma once
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "engine/constrained/grammar_matcher.h"
#include "engine/generate/finish_reason.h"
#include "engine/generate/sampler.h"
#include "engine/text/tokenizer.h"

namespace towers {

class Decoder {
 public:
  // history: the prompt (the repetition penalty looks at it); max_tokens >= 1; constraint: optional,
  // not owned, must outlive the decoder.
  Decoder(const Tokenizer& tokenizer, const SamplerConfig& sampling, std::vector<std::string> stop,
          std::span<const int32_t> history, int max_tokens, GrammarConstraint* constraint = nullptr);

  struct Step {
    int32_t token = -1;  // the sampled token (kept unless finish_reason is Eos)
    std::string text;    // text that became safe to emit with it (may be empty)
    bool done = false;   // generation ended; otherwise evaluate `token` and call step() again
    FinishReason finish_reason = FinishReason::Length;  // when done: Eos, Stop, Length, Context or Grammar
  };
  // Samples from the logits of the last evaluated token. cache_full: the cache has no room left for
  // `token` (checked only when nothing else ended the generation).
  Step step(std::span<const float> logits, bool cache_full);
  // After a generation that ended by Eos, Length or Context (not Stop or a cancellation:
  // keeps_held_text): the text still held back (an incomplete UTF-8 sequence, a possible start of a stop string).
  std::string flush();

  const std::vector<int32_t>& tokens() const { return tokens_; }  // kept tokens so far
  // Why the constraint ended the generation (Grammar); Ok otherwise.
  const Status& grammar_status() const { return grammar_status_; }
  // The logprobs released since the last call, oldest first (empty unless sampling.logprobs >= 0).
  std::vector<Logprobs> take_logprobs();

 private:
  const Tokenizer& tokenizer_;
  Sampler sampler_;
  StopMatcher stops_;
  Detokenizer detok_;
  std::vector<int32_t> history_;
  std::vector<int32_t> tokens_;
  int max_tokens_;
  GrammarConstraint* constraint_;
  std::vector<float> masked_;  // the logits with disallowed tokens at -infinity
  Status grammar_status_;

  // A token's logprobs wait until the text up to its end (a byte offset in the text handed out) is out.
  struct HeldLogprobs {
    Logprobs logprobs;
    size_t start = 0, end = 0;
  };
  void hold_logprobs(int32_t token, bool stopped);
  void release_logprobs(bool all);
  size_t emitted_ = 0;  // bytes of text handed out so far
  size_t last_end_ = 0;
  std::deque<HeldLogprobs> held_;
  std::vector<Logprobs> released_;
};

}  // namespace towers
