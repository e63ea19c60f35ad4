#include "daemon/version.h"

#include "simd/ops.h"
#include "simd/quant_dot.h"

// Defined for this file only (daemon/CMakeLists.txt), so a new commit recompiles nothing else.
#ifndef TOWERS_VERSION
#error "TOWERS_VERSION must be defined by the build"
#endif
#ifndef TOWERS_GIT_COMMIT
#define TOWERS_GIT_COMMIT "unknown"
#endif

namespace towers::daemon {

const char* release_version() { return TOWERS_VERSION; }
const char* git_commit() { return TOWERS_GIT_COMMIT; }

std::string version_text(const std::string& program) {
  // "+sdot": the packed int8 kernels use the Armv8.2 dot product (simd/quant_dot.h).
  const std::string quant = std::string(simd::quant_dot_target()) + (simd::packed_dotprod() ? "+sdot" : "");
  const char* f32 = simd::target_name();
  std::string simd_line = quant == f32 ? quant : quant + " (quantized matmuls), " + f32 + " (f32 kernels)";
  return program + " " + release_version() + "\ncommit " + git_commit() + "\nSIMD " + simd_line;
}

}  // namespace towers::daemon
