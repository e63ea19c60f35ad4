// OpenAI's logprobs objects, from the engine's per-token Logprobs (engine/generate/sampler.h says which
// distribution they come from):
//   chat         {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
//                "bytes"}]}], "refusal": null} (a streamed chunk carries the tokens of its own text);
//   completions  {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}.
// A token whose bytes are not valid UTF-8 on their own (part of a character) is named
// "bytes:\xNN..." (as OpenAI names such tokens); "bytes" always has the exact bytes.
#pragma once
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

#include "engine/generate/sampler.h"

namespace towers::daemon::api {

std::string token_string(std::string_view bytes);
nlohmann::json chat_logprobs(std::span<const Logprobs> tokens);
// text_offset: the byte offset in the completion text where the first token starts; advanced past
// the tokens (a stream keeps counting across chunks).
nlohmann::json completion_logprobs(std::span<const Logprobs> tokens, size_t* text_offset);

}  // namespace towers::daemon::api
