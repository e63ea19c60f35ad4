// Helpers for tests that run the real models of ../shared: loading one, TinyStories passages as
// token ids, all-position logits, and comparing logits.
#pragma once
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "engine/model/forward.h"
#include "engine/model/synth.h"
#include "engine/text/passages.h"
#include "engine/text/tokenizer.h"
#include "test_support.h"

namespace towers::test {

// The model at shared/<rel>, or nullptr (with a SKIP message) when it is absent.
inline std::unique_ptr<Model> load_shared(const char* rel) {
  auto p = shared_file(rel);
  if (p.empty()) return nullptr;
  auto m = Model::load(p.string());
  REQUIRE_MESSAGE(m.ok(), m.error());
  return std::move(m.value());
}

// A synthetic model of `towerctl model synth --shape SHAPE --type TYPE`, written once per build tree as
// <file_tag>-<shape>-<type>.gguf. Each test executable passes its own tag: ctest runs them in parallel.
inline std::unique_ptr<Model> synth_shape(const std::string& file_tag, const std::string& shape,
                                          const std::string& type) {
  SynthOptions o;
  o.shape = shape;
  o.type = type;
  o.out = (temp_dir() / (file_tag + "-" + shape + "-" + type + ".gguf")).string();
  o.shared_dir = shared_dir().string();
  if (!std::filesystem::exists(o.out)) {
    auto st = synthesize_model(o);
    REQUIRE_MESSAGE(st.ok(), st.message());
  }
  auto m = Model::load(o.out);
  REQUIRE_MESSAGE(m.ok(), m.error());
  return std::move(m.value());
}

// The synthetic "tiny" model in file type `type` (f16, q8_0, ...).
inline std::unique_ptr<Model> synth_tiny(const std::string& file_tag, const std::string& type) {
  return synth_shape(file_tag, "tiny", type);
}

// Passages of the TinyStories corpus, tokenized (BOS first), each at least n tokens, cut to n.
inline std::vector<std::vector<int32_t>> passages(const Model& model, int count, int n) {
  auto p = shared_file("corpora/tinystories_val_subset.txt");
  if (p.empty()) return {};
  return corpus_passages(model.tokenizer(), p, count, n);
}

inline std::vector<float> eval_all(Forward& fwd, KvCache& cache, std::span<const int32_t> ids) {
  std::vector<float> logits;
  REQUIRE(fwd.eval(cache, ids, Logits::All, logits).ok());
  return logits;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

}  // namespace towers::test
