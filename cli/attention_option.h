// --attention, for the verbs that take --onednn (bench, perplexity): which attention the oneDNN steps
// run (Forward::set_int8_attention; docs/numerics.md, "int8 prefill attention").
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "engine/model/forward.h"

namespace towers::cli {

// Adds --attention int8|int8-scores|exact (needs --onednn) into *out.
inline CLI::Option* add_attention_option(CLI::App* cmd, std::string* out, const std::string& help) {
  return cmd->add_option("--attention", *out, help)
      ->check(CLI::IsMember({"int8", "int8-scores", "exact"}))
      ->needs("--onednn");
}

// The Forward setting of an --attention value: int8 = Full, int8-scores = Scores, exact = Off.
inline Forward::Int8Attention attention_mode(const std::string& value) {
  return value == "exact" ? Forward::Int8Attention::Off
         : value == "int8-scores" ? Forward::Int8Attention::Scores
                                  : Forward::Int8Attention::Full;
}

}  // namespace towers::cli
