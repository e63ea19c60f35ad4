// io_uring batches (mmapstore/uring_io.h): reads of many files, buffered and O_DIRECT, whole and at
// the end of a file; writes each with its fdatasync; a failing request fails alone. Skips, saying so,
// where the kernel refuses io_uring (the store then uses plain reads and writes).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <random>

#include "mmapstore/uring_io.h"
#include "test_support.h"

using namespace towers;

namespace {

std::unique_ptr<Ring> ring_or_skip() {
  auto r = Ring::open(8);  // small: the batches below must cycle through its entries
  if (!r.ok()) {
    MESSAGE("skipped: " << r.status().message());
    return nullptr;
  }
  return std::move(r.value());
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::filesystem::path write_file(const std::filesystem::path& p, const std::vector<uint8_t>& bytes) {
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  ::close(fd);
  return p;
}

std::vector<uint8_t> read_file(const std::filesystem::path& p) {
  std::vector<uint8_t> out(std::filesystem::file_size(p));
  int fd = ::open(p.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::read(fd, out.data(), out.size()) == static_cast<ssize_t>(out.size()));
  ::close(fd);
  return out;
}

}  // namespace

TEST_CASE("a batch of reads of many files, more pieces than the ring holds, each whole and exact") {
  auto ring = ring_or_skip();
  if (!ring) return;
  const auto dir = test::fresh_dir("uring_read");
  // Sizes around the 1 MiB piece and a file's end: 0, 1, a piece, a piece and a bit, several pieces.
  const std::vector<size_t> sizes = {0, 1, 4096, (1 << 20) - 1, 1 << 20, (1 << 20) + 17, (5 << 20) + 4099};
  std::vector<std::vector<uint8_t>> want, got;
  std::vector<int> fds;
  std::vector<Ring::Read> reads;
  for (size_t i = 0; i < sizes.size(); ++i) {
    want.push_back(random_bytes(sizes[i], static_cast<uint32_t>(i)));
    auto p = write_file(dir / ("f" + std::to_string(i)), want.back());
    fds.push_back(::open(p.c_str(), O_RDONLY));
    got.emplace_back(sizes[i] + 100, 0xee);  // asks for more than the file holds: the end stops it
  }
  for (size_t i = 0; i < sizes.size(); ++i) reads.push_back({fds[i], 0, got[i]});
  auto n = ring->read_all(reads);
  REQUIRE(n.ok());
  for (size_t i = 0; i < sizes.size(); ++i) {
    CAPTURE(sizes[i]);
    CHECK(n.value()[i] == sizes[i]);
    CHECK(std::equal(want[i].begin(), want[i].end(), got[i].begin()));
    CHECK(got[i][sizes[i]] == 0xee);  // nothing written past what was read
  }
  // From an offset, the middle of the largest file.
  std::vector<uint8_t> middle(3000);
  const Ring::Read at{fds.back(), 12345, middle};
  auto m = ring->read_all(std::span(&at, 1));
  REQUIRE(m.ok());
  CHECK(m.value()[0] == middle.size());
  CHECK(std::equal(middle.begin(), middle.end(), want.back().begin() + 12345));
  for (int fd : fds) ::close(fd);
}

TEST_CASE("O_DIRECT reads into aligned memory, the last block short") {
  auto ring = ring_or_skip();
  if (!ring) return;
  const auto dir = test::fresh_dir("uring_direct");
  const size_t size = (3 << 20) + 1000;
  const auto want = random_bytes(size, 7);
  auto p = write_file(dir / "direct", want);
  const int fd = ::open(p.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) {
    MESSAGE("skipped: this file system refuses O_DIRECT");
    return;
  }
  const size_t rounded = (size + 4095) / 4096 * 4096;
  void* mem = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  const Ring::Read r{fd, 0, {static_cast<uint8_t*>(mem), rounded}};
  auto n = ring->read_all(std::span(&r, 1));
  REQUIRE(n.ok());
  CHECK(n.value()[0] == size);
  CHECK(std::equal(want.begin(), want.end(), static_cast<uint8_t*>(mem)));
  ::munmap(mem, rounded);
  ::close(fd);
}

TEST_CASE("a read of a closed descriptor is an error, not a crash") {
  auto ring = ring_or_skip();
  if (!ring) return;
  std::vector<uint8_t> buf(4096);
  const Ring::Read r{-1, 0, buf};
  auto n = ring->read_all(std::span(&r, 1));
  REQUIRE(!n.ok());
  CHECK(n.status().message().find("io_uring read") != std::string::npos);
}

TEST_CASE("a batch of writes, each synced, more than the ring holds, a failing one failing alone") {
  auto ring = ring_or_skip();
  if (!ring) return;
  const auto dir = test::fresh_dir("uring_write");
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<int> fds;
  std::vector<Ring::Write> writes;
  for (int i = 0; i < 12; ++i) {
    bytes.push_back(random_bytes(static_cast<size_t>(i) * 70001, static_cast<uint32_t>(100 + i)));
    fds.push_back(::open((dir / ("w" + std::to_string(i))).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
    REQUIRE(fds.back() >= 0);
  }
  // File 5 is opened read-only: its write fails (EBADF), and its sync is never run.
  ::close(fds[5]);
  fds[5] = ::open((dir / "w5").c_str(), O_RDONLY);
  for (int i = 0; i < 12; ++i) writes.push_back({fds[i], 0, bytes[i], i % 3 != 0});
  const auto status = ring->write_all(writes);
  REQUIRE(status.size() == 12);
  for (int i = 0; i < 12; ++i) {
    CAPTURE(i);
    ::close(fds[i]);
    if (i == 5) {
      CHECK(!status[i].ok());
      CHECK(status[i].message().find("io_uring write") != std::string::npos);
      continue;
    }
    CHECK(status[i].ok());
    CHECK(read_file(dir / ("w" + std::to_string(i))) == bytes[i]);
  }
}

TEST_CASE("a write to a full device is ResourceExhausted, as a posix write's ENOSPC is") {
  auto ring = ring_or_skip();
  if (!ring) return;
  const int fd = ::open("/dev/full", O_WRONLY);
  if (fd < 0) {
    MESSAGE("skipped: no /dev/full here");
    return;
  }
  const std::vector<uint8_t> bytes(10000, 1);
  const Ring::Write w{fd, 0, bytes, true};
  const auto status = ring->write_all(std::span(&w, 1));
  ::close(fd);
  REQUIRE(status.size() == 1);
  CHECK(status[0].code() == Status::Code::kResourceExhausted);
  CHECK(status[0].message().find("No space left") != std::string::npos);
}
