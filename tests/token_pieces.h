// A tokenization's pieces put back together, for checks that tokenizing lost nothing (the unit tests
// and tests/fuzz/tokenizer_fuzz.cc). Needs no test framework.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/text/tokenizer.h"

namespace towers::test {

// Concatenated raw pieces with the SentencePiece dummy-prefix space removed (vocabs with
// add_space_prefix; no UTF-8 repair).
inline std::string raw_pieces(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string s;
  bool start = true;
  for (int32_t id : ids) {
    std::string p = tok.token_to_piece(id);
    if (p.empty()) continue;
    if (start && tok.strips_leading_space() && p[0] == ' ') p.erase(0, 1);
    start = false;
    s += p;
  }
  return s;
}

}  // namespace towers::test
