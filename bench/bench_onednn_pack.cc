// One slice of oneDNN's int8 GEMM as towerd calls it, plain rows (simd::onednn_gemm) against rows packed
// into oneDNN's layout (simd::onednn_gemm_packed), on one thread: GOP/s per token count, and whether the
// two give the same bits (they must: the int32 sums are exact).
//   bench_onednn_pack [rows=1024] [k=2048] [tokens=16,64,512] [seconds=1]
// Last line per token count:
//   bench_onednn_pack rows=R k=K tokens=M plain_gops=<GOP/s> packed_gops=<GOP/s> ratio=<packed/plain> same=1|0
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "simd/onednn_matmul.h"

namespace {

template <typename F>
double gops(size_t M, size_t rows, size_t k, double seconds, F&& call) {
  call();  // primitives created, pages touched
  using clock = std::chrono::steady_clock;
  size_t n = 0;
  const auto t0 = clock::now();
  double dt = 0;
  while (dt < seconds) {
    call();
    ++n;
    dt = std::chrono::duration<double>(clock::now() - t0).count();
  }
  return 2.0 * double(M) * double(rows) * double(k) * double(n) / dt / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace towers::simd;
  const size_t rows = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 1024;
  const size_t k = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 2048;
  std::vector<size_t> tokens;
  for (const char* p = argc > 3 ? argv[3] : "16,64,512"; *p;) {
    tokens.push_back(std::strtoul(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  const double seconds = argc > 4 ? std::atof(argv[4]) : 1.0;
  if (!onednn_available() || rows == 0 || rows > kOnednnSliceRows || k == 0 || k % 256 != 0) {
    std::fprintf(stderr, "usage: bench_onednn_pack [rows<=%zu] [k: a multiple of 256] [tokens] [seconds] (%s)\n",
                 kOnednnSliceRows, onednn_describe());
    return 2;
  }
  const size_t packed_bytes = onednn_packed_bytes(rows, k);
  std::printf("%s; packed layout: %s\n", onednn_describe(), packed_bytes ? "yes" : "none (plain rows only)");
  std::mt19937 rng(1);
  std::vector<int8_t> w(rows * k);
  std::vector<float> ws(rows, 1e-3f);
  for (auto& v : w) v = static_cast<int8_t>(static_cast<int>(rng() % 127) - 63);
  std::vector<uint8_t> packed(packed_bytes);
  if (packed_bytes && !onednn_pack_weights(w.data(), rows, k, packed.data())) return 1;
  for (size_t M : tokens) {
    std::vector<int8_t> a(M * k);
    std::vector<float> as(M, 1e-2f), y_plain(M * rows), y_packed(M * rows);
    for (auto& v : a) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
    const double plain = gops(M, rows, k, seconds, [&] {
      onednn_gemm(w.data(), ws.data(), 0, rows, a.data(), as.data(), M, k, k, y_plain.data(), rows);
    });
    double pk = 0;
    if (packed_bytes) {
      pk = gops(M, rows, k, seconds, [&] {
        onednn_gemm_packed(packed.data(), rows, 0, ws.data(), a.data(), as.data(), M, k, y_packed.data(), rows);
      });
    }
    std::printf("bench_onednn_pack rows=%zu k=%zu tokens=%zu plain_gops=%.1f packed_gops=%.1f ratio=%.2f same=%d\n", rows, k,
                M, plain, pk, pk / plain, int(!packed_bytes || y_plain == y_packed));
  }
  return 0;
}
