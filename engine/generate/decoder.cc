#include "engine/generate/decoder.h"

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
      s.finish_reason = grammar_status_.ok() ? FinishReason::Eos : FinishReason::Grammar;
      return s;
    }
    logits = masked_;
  }
  s.token = sampler_.sample(logits, history_, tokens_);
  if (constraint_) {
    if (Status st = constraint_->accept(s.token); !st.ok()) {  // cannot happen: the token was allowed
      grammar_status_ = st;
      s.done = true;
      s.finish_reason = FinishReason::Grammar;
      return s;
    }
  }
  if (tokenizer_.is_end_of_generation(s.token)) {
    s.done = true;
    s.finish_reason = FinishReason::Eos;
    return s;
  }
  tokens_.push_back(s.token);
  history_.push_back(s.token);
  StopMatcher::Output out = stops_.feed(detok_.feed(s.token));
  s.text = std::move(out.text);
  emitted_ += s.text.size();
  if (sampler_.config().logprobs >= 0) hold_logprobs(s.token, out.stopped);
  if (out.stopped) {
    s.done = true;
    s.finish_reason = FinishReason::Stop;
  } else if (static_cast<int>(tokens_.size()) >= max_tokens_) {
    s.done = true;
    s.finish_reason = FinishReason::Length;
  } else if (cache_full) {
    s.done = true;
    s.finish_reason = FinishReason::Context;
  }
  return s;
}

std::string Decoder::flush() {
  StopMatcher::Output tail = stops_.feed(detok_.flush());
  std::string text = tail.text + (tail.stopped ? "" : stops_.flush());
  emitted_ += text.size();
  release_logprobs(/*all=*/true);
  return text;
}

void Decoder::hold_logprobs(int32_t token, bool stopped) {
  Logprobs lp = sampler_.logprobs(token, sampler_.config().logprobs);
  lp.chosen.bytes = tokenizer_.token_to_piece(token, /*special=*/true);
  for (TokenLogprob& t : lp.top) t.bytes = tokenizer_.token_to_piece(t.token, /*special=*/true);
  // Held-back text (a possible stop string, an incomplete UTF-8 sequence) comes out at least as long
  // as it went in (U+FFFD replaces at most 3 bytes by 3), so the end is never past the token's text.
  const size_t end = stopped ? emitted_ : emitted_ + stops_.held_bytes() + detok_.held_bytes();
  held_.push_back({std::move(lp), last_end_, end});
  last_end_ = end;
  if (!stopped) return release_logprobs(/*all=*/false);
  // Stopped: the tokens that put at least one byte before the stop string are kept.
  for (HeldLogprobs& h : held_) {
    if (h.start < emitted_) released_.push_back(std::move(h.logprobs));
  }
  held_.clear();
}

void Decoder::release_logprobs(bool all) {
  while (!held_.empty() && (all || held_.front().end <= emitted_)) {
    released_.push_back(std::move(held_.front().logprobs));
    held_.pop_front();
  }
}

std::vector<Logprobs> Decoder::take_logprobs() {
  std::vector<Logprobs> out;
  out.swap(released_);
  return out;
}

}  // namespace towers
