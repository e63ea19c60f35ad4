#include "engine/decoder.h"

namespace towers {

Decoder::Decoder(const Tokenizer& tokenizer, const SamplerConfig& sampling, std::vector<std::string> stop,
                 std::span<const int32_t> history, int max_tokens, GrammarConstraint* constraint)
    : tokenizer_(tokenizer),
      sampler_(sampling),
      stops_(std::move(stop)),
      detok_(tokenizer),
      history_(history.begin(), history.end()),
      max_tokens_(max_tokens),
      constraint_(constraint) {}

Decoder::Step Decoder::step(std::span<const float> logits, bool cache_full) {
  Step s;
  if (constraint_) {
    masked_.assign(logits.begin(), logits.end());
    auto allowed = constraint_->mask_logits(masked_);
    if (!allowed.ok() || *allowed == 0) {
      if (!allowed.ok()) grammar_status_ = allowed.status();
      else if (!constraint_->is_complete())
        grammar_status_ = Status::InvalidArgument("grammar: no token of the vocabulary can continue it");
      s.done = true;
      s.finish_reason = grammar_status_.ok() ? "eos" : "grammar";
      return s;
    }
    logits = masked_;
  }
  s.token = sampler_.sample(logits, history_);
  if (constraint_) {
    if (Status st = constraint_->accept(s.token); !st.ok()) {  // cannot happen: the token was allowed
      grammar_status_ = st;
      s.done = true;
      s.finish_reason = "grammar";
      return s;
    }
  }
  if (tokenizer_.is_end_of_generation(s.token)) {
    s.done = true;
    s.finish_reason = "eos";
    return s;
  }
  tokens_.push_back(s.token);
  history_.push_back(s.token);
  StopMatcher::Output out = stops_.feed(detok_.feed(s.token));
  s.text = std::move(out.text);
  if (out.stopped) {
    s.done = true;
    s.finish_reason = "stop";
  } else if (static_cast<int>(tokens_.size()) >= max_tokens_) {
    s.done = true;
    s.finish_reason = "length";
  } else if (cache_full) {
    s.done = true;
    s.finish_reason = "context";
  }
  return s;
}

std::string Decoder::flush() {
  StopMatcher::Output tail = stops_.feed(detok_.flush());
  return tail.text + (tail.stopped ? "" : stops_.flush());
}

}  // namespace towers
