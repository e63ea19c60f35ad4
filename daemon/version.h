// What towerd and towerctl print for --version: the release (CMake's project VERSION), the git
// commit it was built from (`git describe --always --dirty` when configured, -DTOWERS_GIT_COMMIT for
// a build outside a checkout, else "unknown") and the Highway targets this CPU's kernels dispatch to.
#pragma once
#include <string>

namespace towers::daemon {

// "0.1.0"
const char* release_version();
// "f01db24-dirty", or "unknown"
const char* git_commit();
// Three lines, e.g. "towerd 0.1.0\ncommit f01db24\nSIMD AVX3_DL (quantized matmuls), AVX3 (f32 kernels)".
std::string version_text(const std::string& program);

}  // namespace towers::daemon
