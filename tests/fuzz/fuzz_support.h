// What the libFuzzer targets in this directory share: failing loudly, and the input as a file for the
// readers that take a path (a per-process file under $TMPDIR, rewritten for every input).
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace towers::fuzz {

// A finding that no sanitizer would report (a wrong answer, an error without a message): abort, so
// libFuzzer saves the input.
[[noreturn]] inline void die(const char* target, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", target, what.c_str());
  std::abort();
}

inline std::string_view text_of(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The path of this process's scratch file for a target (jobs of one target run in parallel).
inline std::filesystem::path scratch_path(const char* target) {
  const char* tmp = std::getenv("TMPDIR");
  return std::filesystem::path(tmp && *tmp ? tmp : "/tmp") /
         (std::string(target) + "." + std::to_string(::getpid()));
}

// Writes bytes to `path` (replacing it); aborts when it cannot (the input would not be tested).
inline void write_file(const std::filesystem::path& path, std::span<const uint8_t> bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) ||
      std::fclose(f) != 0) {
    die("fuzz", "cannot write " + path.string());
  }
}

// Splits the input at the first byte `sep`: {before, after} (after is empty when there is none).
inline std::pair<std::string_view, std::string_view> split_at(std::string_view in, char sep) {
  const size_t at = in.find(sep);
  if (at == std::string_view::npos) return {in, {}};
  return {in.substr(0, at), in.substr(at + 1)};
}

// For a target whose seeds are made by code (valid checksums): TOWERS_FUZZ_SEEDS below, and
// `TARGET --write-seeds=DIR` writes seeds() into DIR as seed-0, seed-1, ... and exits (libFuzzer
// ignores flags that start with "--").
using Seeds = std::vector<std::vector<uint8_t>>;
inline void write_seeds_if_asked(int argc, char** argv, Seeds (*seeds)()) {
  const std::string flag = "--write-seeds=";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind(flag, 0) != 0) continue;
    const std::filesystem::path dir = a.substr(flag.size());
    std::filesystem::create_directories(dir);
    const Seeds all = seeds();
    for (size_t k = 0; k < all.size(); ++k) write_file(dir / ("seed-" + std::to_string(k)), all[k]);
    std::printf("%zu seeds in %s\n", all.size(), dir.c_str());
    std::exit(0);
  }
}

// Defines LLVMFuzzerInitialize for a target whose seeds() writes its seed corpus.
#define TOWERS_FUZZ_SEEDS(seeds)                                  \
  extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) { \
    towers::fuzz::write_seeds_if_asked(*argc, *argv, seeds);     \
    return 0;                                                     \
  }

inline std::vector<uint8_t> bytes_of(std::string_view s) { return {s.begin(), s.end()}; }

}  // namespace towers::fuzz
