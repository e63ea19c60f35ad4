#include "engine/text/passages.h"

#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

namespace towers {

std::vector<std::vector<int32_t>> corpus_passages(const Tokenizer& tokenizer, const std::filesystem::path& file,
                                                  int count, int n) {
  constexpr size_t kPiece = 4000;
  std::vector<std::vector<int32_t>> out;
  std::ifstream in(file);
  if (!in) return out;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  for (size_t at = 0; static_cast<int>(out.size()) < count && at + kPiece < text.size(); at += kPiece) {
    auto ids = tokenizer.encode(std::string_view(text).substr(at, kPiece), true, false);
    if (static_cast<int>(ids.size()) < n) continue;
    ids.resize(size_t(n));
    out.push_back(std::move(ids));
  }
  return out;
}

}  // namespace towers
