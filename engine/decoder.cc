#include "engine/decoder.h"

namespace towers {

Decoder::Decoder(const Tokenizer& tokenizer, const SamplerConfig& sampling, std::vector<std::string> stop,
                 std::span<const int32_t> history, int max_tokens)
    : tokenizer_(tokenizer),
      sampler_(sampling),
      stops_(std::move(stop)),
      detok_(tokenizer),
      history_(history.begin(), history.end()),
      max_tokens_(max_tokens) {}

Decoder::Step Decoder::step(std::span<const float> logits, bool cache_full) {
  Step s;
  s.token = sampler_.sample(logits, history_);
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
