// Helpers shared by the tests: where ../shared is, and skipping when it is absent.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <hwy/targets.h>

namespace towers::test {

// TOWERS_SHARED overrides the build-time default (<source>/../shared).
inline std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("TOWERS_SHARED"); env && *env) return env;
  return TOWERS_SHARED_DEFAULT;
}

// Path of a file under shared/, or empty (with a printed reason) when it is not there.
inline std::filesystem::path shared_file(const std::string& rel) {
  auto p = shared_dir() / rel;
  if (!std::filesystem::exists(p)) {
    MESSAGE("SKIP: " << p.string() << " not found (set TOWERS_SHARED to the shared/ data folder)");
    return {};
  }
  return p;
}

// A copy of a span's elements (segment bytes are views; tests keep what they compare).
template <class T>
std::vector<std::remove_const_t<T>> to_vec(std::span<T> s) {
  return {s.begin(), s.end()};
}

// n tokens drawn uniformly from [3, vocab) (above the usual special ids).
inline std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int vocab) {
  std::uniform_int_distribution<int32_t> d(3, vocab - 1);
  std::vector<int32_t> v(n);
  for (auto& t : v) t = d(rng);
  return v;
}

inline std::vector<int32_t> concat(std::initializer_list<std::span<const int32_t>> parts) {
  std::vector<int32_t> out;
  for (auto p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// splitmix64: the same integers on every machine (std::*_distribution is not specified bit for bit).
struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

inline std::filesystem::path temp_dir() {
  auto p = std::filesystem::path(TOWERS_BINARY_DIR) / "test-tmp";
  std::filesystem::create_directories(p);
  return p;
}

// An empty directory temp_dir()/name (whatever an earlier run left there is removed).
inline std::filesystem::path fresh_dir(const std::string& name) {
  auto d = temp_dir() / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// Runs fn(target) once per Highway target compiled in and runnable here, with dynamic dispatch
// restricted to that target (its name captured for failure messages); normal dispatch is restored
// afterwards, also when fn stops early (a failed REQUIRE).
template <class Fn>
void for_each_target(Fn&& fn) {
  struct Restore {
    ~Restore() { hwy::SetSupportedTargetsForTest(0); }
  } restore;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string target_name = hwy::TargetName(target);
    CAPTURE(target_name);
    MESSAGE("checking target " << target_name);
    fn(target);
  }
}

}  // namespace towers::test
