// A FileSystem for tests: the real one, except that creating a file waits while the gate is closed.
// A test holds the segment writer thread at a known point (before its next file) instead of racing
// it, and lets it go on with open().
#pragma once
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>

#include "mmapstore/posix_file.h"

namespace towers::test {

class GatedFS final : public FileSystem {
 public:
  void close() {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  void open() {
    {
      std::lock_guard lock(mu_);
      closed_ = false;
    }
    cv_.notify_all();
  }
  Result<std::unique_ptr<WritableFile>> open_append(const std::filesystem::path& path) override {
    return posix_fs().open_append(path);
  }
  Result<std::unique_ptr<WritableFile>> create(const std::filesystem::path& path) override {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !closed_; });
    lock.unlock();
    return posix_fs().create(path);
  }
  Status rename(const std::filesystem::path& from, const std::filesystem::path& to) override {
    return posix_fs().rename(from, to);
  }
  Status remove(const std::filesystem::path& path) override { return posix_fs().remove(path); }
  Status sync_dir(const std::filesystem::path& dir) override { return posix_fs().sync_dir(dir); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
};

}  // namespace towers::test
