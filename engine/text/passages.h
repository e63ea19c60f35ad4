// Fixed-length token passages cut from a text corpus: what perplexity, drift and quality checks feed
// the model (tests and benchmarks share the cut, so their numbers are of the same passages).
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

#include "engine/text/tokenizer.h"

namespace towers {

// Up to `count` passages of exactly `n` tokens (BOS first): the file is read in 4000-byte pieces, each
// tokenized alone, and a piece shorter than n tokens is skipped. Empty when the file cannot be read.
std::vector<std::vector<int32_t>> corpus_passages(const Tokenizer& tokenizer, const std::filesystem::path& file,
                                                  int count, int n);

}  // namespace towers
