// The synthetic Llama-3.2-1B Q4_0 model the benchmarks run the 1B shape on (bench_restart,
// bench_capacity): written once into a work directory, with the shared data's tokenizer when present
// (TOWERS_SHARED, else the build's default). Needs TOWERS_SHARED_DEFAULT defined by the target.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

#include "engine/model/synth.h"

namespace towers::bench {

// A synthetic model of `shape` and `type`, written once into `dir` (synth-<shape>-<type>.gguf).
inline Result<std::string> synthetic_model(const std::filesystem::path& dir, const std::string& shape, const std::string& type) {
  const std::string path = (dir / ("synth-" + shape + "-" + type + ".gguf")).string();
  if (std::filesystem::exists(path)) return path;
  SynthOptions so;
  so.shape = shape;
  so.type = type;
  so.out = path;
  const char* shared = std::getenv("TOWERS_SHARED");
  so.shared_dir = shared ? shared : TOWERS_SHARED_DEFAULT;
  if (Status s = synthesize_model(so); !s.ok()) return s;
  return path;
}

inline Result<std::string> synthetic_llama_1b(const std::filesystem::path& dir) { return synthetic_model(dir, "llama3.2-1b", "q4_0"); }

}  // namespace towers::bench
