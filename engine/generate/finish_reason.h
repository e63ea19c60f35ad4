// Why a generation ended. The decoder ends it for the first five; a caller that drives decoders ends
// it for the rest (generate()'s callback, the daemon's scheduler). The names are what logs, metrics
// (towerd_generations_total{finish}) and towerd's "towers.finish" timings show; what an OpenAI client
// sees is the daemon's mapping of them (daemon/api_reply.h, openai_finish_reason).
#pragma once
#include <string_view>

namespace towers {

enum class FinishReason {
  Eos,        // an end-of-generation token (or a complete grammar with nothing left to add)
  Stop,       // a stop string
  Length,     // max_tokens
  Context,    // the cache is full
  Grammar,    // the constraint's grammar cannot continue (Decoder::grammar_status says why)
  Cancelled,  // the caller stopped it (a client that went away)
  Timeout,    // the caller's deadline
  Error,      // the caller failed it (its Status says why)
};

constexpr std::string_view to_string(FinishReason r) {
  switch (r) {
    case FinishReason::Eos: return "eos";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Context: return "context";
    case FinishReason::Grammar: return "grammar";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Timeout: return "timeout";
    case FinishReason::Error: return "error";
  }
  return "error";
}

// Whether the text the decoder still holds back (Decoder::flush) belongs to the reply: not after a
// stop string (it is the stop string's start) nor after a cancellation.
constexpr bool keeps_held_text(FinishReason r) { return r != FinishReason::Stop && r != FinishReason::Cancelled; }

}  // namespace towers
