// How to bring a warm segment path back into memory (issue 11: "measure and choose"). A path of
// segment-sized files (default: 3 files, 10 + 7 + 9 MB, a 1B bot's platform/community/bot KV) is
// dropped from the page cache (posix_fadvise DONTNEED on each file: no root, no drop_caches), mapped
// read-only, and made resident by each method; then every page is read once, as attention would,
// and the whole is timed:
//   fault        nothing ahead: attention's reads take a page fault per page (the baseline)
//   willneed     madvise(MADV_WILLNEED) on every mapping, then the reads
//   populate     madvise(MADV_POPULATE_READ) on every mapping (what the pool's pager does), then the reads
//   read         read() of each file into a scratch buffer first (the page cache filled by plain I/O),
//                then the reads of the mapping
//   pread        no mapping: each file read with O_DIRECT into owned memory, one pread after another
//   uring        the same reads, all files in one io_uring batch of 1 MiB requests (mmapstore/uring_io.h)
// Then the writes of a segment writer's batch (issue 24 item 4), each file written and fdatasync'd:
//   posix        one file after another (mmapstore/segment_writer.cc's phase 1 today)
//   uring        every file's write with its fdatasync linked behind it, all submitted at once
// for the same files and for --small N files of 256 KiB (a batch of session transcript segments).
// Median of --reps rounds, methods interleaved. Lines:
//   pagein bytes=B fault_ms=F willneed_ms=W populate_ms=P read_ms=R pread_ms=D uring_ms=U best=NAME
//   segwrite files=N bytes=B posix_ms=P uring_ms=U best=NAME   (twice: the path's files, the small ones)
//   bench_pagein [--dir DIR] [--mb 10,7,9] [--small 16] [--reps 7]
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

#include "mmapstore/uring_io.h"

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

size_t round_up(size_t n) { return (n + 4095) / 4096 * 4096; }

// Reads every file with O_DIRECT into fresh anonymous memory (its allocation counted: a page-in into
// owned memory pays it), by pread or in one io_uring batch; reads one byte per page; milliseconds.
double run_owned(const std::vector<File>& files, towers::Ring* ring, uint64_t* sink) {
  const auto t0 = Clock::now();
  std::vector<int> fds;
  std::vector<std::pair<uint8_t*, size_t>> bufs;
  std::vector<towers::Ring::Read> reads;
  for (const File& f : files) {
    int fd = ::open(f.path.c_str(), O_RDONLY | O_DIRECT);
    void* p = ::mmap(nullptr, round_up(f.bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (fd < 0 || p == MAP_FAILED) std::exit(1);
    fds.push_back(fd);
    bufs.emplace_back(static_cast<uint8_t*>(p), round_up(f.bytes));
    reads.push_back({fd, 0, {static_cast<uint8_t*>(p), round_up(f.bytes)}});
  }
  if (ring != nullptr) {
    auto got = ring->read_all(reads);
    if (!got.ok()) {
      std::fprintf(stderr, "bench_pagein: %s\n", got.status().message().c_str());
      std::exit(1);
    }
  } else {
    for (const auto& r : reads) {
      size_t done = 0;
      while (done < r.into.size()) {
        ssize_t n = ::pread(r.fd, r.into.data() + done, r.into.size() - done, static_cast<off_t>(done));
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
    }
  }
  uint64_t sum = 0;
  for (auto& [p, n] : bufs) {
    for (size_t i = 0; i < n; i += 4096) sum += p[i];
  }
  *sink += sum;
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  for (auto& [p, n] : bufs) ::munmap(p, n);
  for (int fd : fds) ::close(fd);
  return ms;
}

// Writes `files` (fresh names, created and truncated) with their fdatasync: one after another, or
// in one io_uring batch; milliseconds (the files are removed afterwards, untimed).
double run_writes(const std::vector<File>& files, const std::vector<uint8_t>& bytes, towers::Ring* ring) {
  const auto t0 = Clock::now();
  std::vector<int> fds;
  for (const File& f : files) {
    int fd = ::open((f.path + ".w").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) std::exit(1);
    fds.push_back(fd);
  }
  if (ring != nullptr) {
    std::vector<towers::Ring::Write> writes;
    for (size_t i = 0; i < files.size(); ++i) writes.push_back({fds[i], 0, {bytes.data(), files[i].bytes}, true});
    for (const auto& st : ring->write_all(writes)) {
      if (!st.ok()) {
        std::fprintf(stderr, "bench_pagein: %s\n", st.message().c_str());
        std::exit(1);
      }
    }
  } else {
    for (size_t i = 0; i < files.size(); ++i) {
      if (::write(fds[i], bytes.data(), files[i].bytes) != static_cast<ssize_t>(files[i].bytes) || ::fdatasync(fds[i]) != 0) {
        std::exit(1);
      }
    }
  }
  for (int fd : fds) ::close(fd);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  for (const File& f : files) ::unlink((f.path + ".w").c_str());
  return ms;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
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
  int small = 16;
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
    else if (a == "--small") small = std::max(1, std::atoi(next().c_str()));
    else if (a == "--mb") {
      mb.clear();
      std::string v = next();
      for (size_t at = 0; at < v.size();) {
        size_t comma = v.find(',', at);
        mb.push_back(static_cast<size_t>(std::max(1, std::atoi(v.substr(at, comma - at).c_str()))));
        at = comma == std::string::npos ? v.size() : comma + 1;
      }
    } else {
      std::fprintf(stderr, "usage: bench_pagein [--dir DIR] [--mb 10,7,9] [--small 16] [--reps 7]\n");
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
  auto ring = towers::Ring::open(64);
  if (!ring.ok()) {
    std::fprintf(stderr, "bench_pagein: %s\n", ring.status().message().c_str());
    return 1;
  }
  const char* methods[] = {"fault", "willneed", "populate", "read", "pread", "uring"};
  constexpr int kMethods = 6;
  std::vector<std::vector<double>> ms(kMethods);
  uint64_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    for (int m = 0; m < kMethods; ++m) {
      const int k = (m + r) % kMethods;  // interleaved, a different method first each round
      for (const File& f : files) drop(f);
      if (k == 4) ms[k].push_back(run_owned(files, nullptr, &sink));
      else if (k == 5) ms[k].push_back(run_owned(files, ring.value().get(), &sink));
      else ms[k].push_back(run(files, methods[k], &sink));
    }
  }
  std::printf("page-in of %zu files, %.1f MB, from a dropped page cache (%s), median of %d:\n", files.size(),
              static_cast<double>(total) / 1e6, dir.c_str(), reps);
  double med[kMethods];
  int best = 0;
  for (int k = 0; k < kMethods; ++k) {
    std::sort(ms[k].begin(), ms[k].end());
    med[k] = ms[k][ms[k].size() / 2];
    if (med[k] < med[best]) best = k;
    std::printf("  %-9s %8.1f ms  %6.2f GB/s  (min %.1f, max %.1f)\n", methods[k], med[k],
                static_cast<double>(total) / med[k] / 1e6, ms[k].front(), ms[k].back());
  }
  std::printf("pagein bytes=%zu fault_ms=%.1f willneed_ms=%.1f populate_ms=%.1f read_ms=%.1f pread_ms=%.1f uring_ms=%.1f "
              "best=%s%s\n",
              total, med[0], med[1], med[2], med[3], med[4], med[5], methods[best], sink == 42 ? " " : "");
  // Writes: the path's files, then a batch of small ones.
  std::vector<File> smalls;
  for (int i = 0; i < small; ++i) smalls.push_back({dir + "/small-" + std::to_string(i) + ".bin", 256 << 10});
  std::vector<uint8_t> bytes(std::max(*std::max_element(mb.begin(), mb.end()) << 20, size_t{256} << 10));
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(rng());
  for (const std::vector<File>* set : {&files, &smalls}) {
    std::vector<double> posix, uring;
    size_t set_bytes = 0;
    for (const File& f : *set) set_bytes += f.bytes;
    for (int r = 0; r < reps; ++r) {
      for (int m = 0; m < 2; ++m) {
        const bool use_ring = (m + r) % 2 == 1;
        (use_ring ? uring : posix).push_back(run_writes(*set, bytes, use_ring ? ring.value().get() : nullptr));
      }
    }
    const double p = median(posix), u = median(uring);
    std::printf("segwrite files=%zu bytes=%zu posix_ms=%.1f uring_ms=%.1f best=%s\n", set->size(), set_bytes, p, u,
                u < p ? "uring" : "posix");
  }
  std::filesystem::remove_all(dir);
  return 0;
}
