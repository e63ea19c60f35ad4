// How to bring a warm segment path back into memory (issue 11: "measure and choose"). A path of
// segment-sized files (default: 3 files, 10 + 7 + 9 MB, a 1B bot's platform/community/bot KV) is
// dropped from the page cache (posix_fadvise DONTNEED on each file: no root, no drop_caches), mapped
// read-only, and made resident by each method; then every page is read once, as attention would,
// and the whole is timed:
//   fault        nothing ahead: attention's reads take a page fault per page (the baseline)
//   willneed     madvise(MADV_WILLNEED) on every mapping, then the reads
//   populate     madvise(MADV_POPULATE_READ) on every mapping (what the pool's pager does), then the reads
//   read         read() of each file into a scratch buffer first (the page cache filled by plain I/O,
//                as an io_uring read would), then the reads of the mapping
// Median of --reps rounds, methods interleaved. Last line:
//   pagein bytes=B fault_ms=F willneed_ms=W populate_ms=P read_ms=R best=NAME
//   bench_pagein [--dir DIR] [--mb 10,7,9] [--reps 7]
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct File {
  std::string path;
  size_t bytes;
};

void drop(const File& f) {
  int fd = ::open(f.path.c_str(), O_RDONLY);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Maps every file, applies `method`, reads one byte per 4 KiB page of each; returns milliseconds.
double run(const std::vector<File>& files, const std::string& method, uint64_t* sink) {
  const auto t0 = Clock::now();
  std::vector<std::pair<uint8_t*, size_t>> maps;
  std::vector<uint8_t> scratch;
  for (const File& f : files) {
    int fd = ::open(f.path.c_str(), O_RDONLY);
    if (method == "read") {
      scratch.resize(f.bytes);
      size_t done = 0;
      while (done < f.bytes) {
        ssize_t n = ::read(fd, scratch.data() + done, f.bytes - done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
    }
    void* p = ::mmap(nullptr, f.bytes, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) std::exit(1);
    maps.emplace_back(static_cast<uint8_t*>(p), f.bytes);
  }
  for (auto& [p, n] : maps) {
    if (method == "willneed") ::madvise(p, n, MADV_WILLNEED);
#ifdef MADV_POPULATE_READ
    if (method == "populate") ::madvise(p, n, MADV_POPULATE_READ);
#endif
  }
  uint64_t sum = 0;
  for (auto& [p, n] : maps) {
    for (size_t i = 0; i < n; i += 4096) sum += p[i];
  }
  *sink += sum;
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  for (auto& [p, n] : maps) ::munmap(p, n);
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/var/tmp/bench_pagein." + std::to_string(::getpid());
  std::vector<size_t> mb = {10, 7, 9};
  int reps = 7;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_pagein: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--dir") dir = next();
    else if (a == "--reps") reps = std::max(1, std::atoi(next().c_str()));
    else if (a == "--mb") {
      mb.clear();
      std::string v = next();
      for (size_t at = 0; at < v.size();) {
        size_t comma = v.find(',', at);
        mb.push_back(static_cast<size_t>(std::max(1, std::atoi(v.substr(at, comma - at).c_str()))));
        at = comma == std::string::npos ? v.size() : comma + 1;
      }
    } else {
      std::fprintf(stderr, "usage: bench_pagein [--dir DIR] [--mb 10,7,9] [--reps 7]\n");
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }
  std::filesystem::create_directories(dir);
  std::vector<File> files;
  std::mt19937_64 rng(1);
  size_t total = 0;
  for (size_t i = 0; i < mb.size(); ++i) {
    File f{dir + "/seg-" + std::to_string(i) + ".bin", mb[i] << 20};
    std::vector<uint64_t> data(f.bytes / 8);
    for (auto& x : data) x = rng();
    int fd = ::open(f.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::write(fd, data.data(), f.bytes) != static_cast<ssize_t>(f.bytes)) return 1;
    ::fsync(fd);
    ::close(fd);
    files.push_back(f);
    total += f.bytes;
  }
  const char* methods[] = {"fault", "willneed", "populate", "read"};
  std::vector<std::vector<double>> ms(4);
  uint64_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    for (int m = 0; m < 4; ++m) {
      const int k = (m + r) % 4;  // interleaved, a different method first each round
      for (const File& f : files) drop(f);
      ms[k].push_back(run(files, methods[k], &sink));
    }
  }
  std::printf("page-in of %zu files, %.1f MB, from a dropped page cache (%s), median of %d:\n", files.size(),
              static_cast<double>(total) / 1e6, dir.c_str(), reps);
  double med[4];
  int best = 0;
  for (int k = 0; k < 4; ++k) {
    std::sort(ms[k].begin(), ms[k].end());
    med[k] = ms[k][ms[k].size() / 2];
    if (med[k] < med[best]) best = k;
    std::printf("  %-9s %8.1f ms  %6.2f GB/s  (min %.1f, max %.1f)\n", methods[k], med[k],
                static_cast<double>(total) / med[k] / 1e6, ms[k].front(), ms[k].back());
  }
  std::filesystem::remove_all(dir);
  std::printf("pagein bytes=%zu fault_ms=%.1f willneed_ms=%.1f populate_ms=%.1f read_ms=%.1f best=%s%s\n", total, med[0],
              med[1], med[2], med[3], methods[best], sink == 42 ? " " : "");
  return 0;
}
