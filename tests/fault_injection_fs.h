// A FileSystem for tests that sits between the store and the real disk and can pretend the machine
// crashed (LevelDB's db/fault_injection_test.cc is the model): crash() throws away what POSIX does
// not promise to keep — bytes appended after the last sync of their file, and names created, renamed
// or removed after the last sync of their directory — optionally keeping a random prefix of the
// unsynced bytes (a torn write). It also fails on request: a sync, a rename, a directory sync, or a
// write once a byte quota is used (ENOSPC).
#pragma once
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "mmapstore/posix_file.h"

namespace towers::test {

class FaultInjectionFS final : public FileSystem {
 public:
  struct Faults {
    int fail_sync_after = -1;         // the (n+1)-th file sync fails (-1: never)
    int fail_rename_after = -1;       // the (n+1)-th rename fails
    int fail_dir_sync_after = -1;     // the (n+1)-th directory sync fails
    int64_t space_left = -1;          // bytes that may still be written; then ENOSPC (-1: unlimited)
  };
  Faults faults;

  Result<std::unique_ptr<WritableFile>> open_append(const std::filesystem::path& path) override {
    std::lock_guard lock(mu_);
    const bool existed = std::filesystem::exists(path);
    auto f = posix_fs().open_append(path);
    if (!f.ok()) return f.status();
    (void)state(path, existed, f.value()->size());
    return std::unique_ptr<WritableFile>(new File(*this, path, std::move(f.value())));
  }
  Result<std::unique_ptr<WritableFile>> create(const std::filesystem::path& path) override {
    std::lock_guard lock(mu_);
    const bool existed = std::filesystem::exists(path);
    if (existed) note_replaced(path);
    auto f = posix_fs().create(path);
    if (!f.ok()) return f.status();
    State& s = files_[key(path)];
    s.synced_size = 0;
    if (!existed) s.durable_name = false;
    return std::unique_ptr<WritableFile>(new File(*this, path, std::move(f.value())));
  }
  Status rename(const std::filesystem::path& from, const std::filesystem::path& to) override {
    std::lock_guard lock(mu_);
    if (faults.fail_rename_after >= 0 && renames_++ >= faults.fail_rename_after) {
      return errno_status("cannot rename " + from.string() + " to", to, EIO);
    }
    note_replaced(from);
    note_replaced(to);
    if (Status st = posix_fs().rename(from, to); !st.ok()) return st;
    State moved = files_.count(key(from)) ? files_[key(from)] : State{};
    files_.erase(key(from));
    moved.durable_name = false;  // the new name is not durable until its directory is synced
    files_[key(to)] = moved;
    return Status::Ok();
  }
  Status remove(const std::filesystem::path& path) override {
    std::lock_guard lock(mu_);
    note_replaced(path);
    files_.erase(key(path));
    return posix_fs().remove(path);
  }
  Status sync_dir(const std::filesystem::path& dir) override {
    std::lock_guard lock(mu_);
    if (faults.fail_dir_sync_after >= 0 && dir_syncs_++ >= faults.fail_dir_sync_after) {
      return errno_status("cannot fsync directory", dir, EIO);
    }
    const std::string d = key(dir);
    for (auto& [p, s] : files_) {
      if (std::filesystem::path(p).parent_path() == d) s.durable_name = true;
    }
    for (auto it = replaced_.begin(); it != replaced_.end();) {
      it = std::filesystem::path(it->first).parent_path() == d ? replaced_.erase(it) : std::next(it);
    }
    return Status::Ok();
  }

  // The crash. Afterwards the directory holds what a real disk could hold; reopen from there.
  // torn: each file keeps a random prefix of its unsynced bytes instead of none.
  void crash(std::mt19937& rng, bool torn) {
    std::lock_guard lock(mu_);
    // Names first: what was replaced or removed since its directory's last sync comes back.
    for (auto& [path, old] : replaced_) {
      if (old) {
        std::ofstream(path, std::ios::binary | std::ios::trunc) << *old;
        files_[path] = State{old->size(), true, {}};
      } else {
        std::filesystem::remove(path);
        files_.erase(path);
      }
    }
    replaced_.clear();
    for (auto it = files_.begin(); it != files_.end();) {
      if (!it->second.durable_name) {
        std::filesystem::remove(it->first);
        it = files_.erase(it);
        continue;
      }
      const uint64_t size = std::filesystem::file_size(it->first);
      uint64_t keep = it->second.synced_size;
      if (torn && size > keep) keep += std::uniform_int_distribution<uint64_t>(0, size - keep)(rng);
      std::filesystem::resize_file(it->first, std::min(keep, size));
      it->second.synced_size = std::min(keep, size);
      for (auto [from, to] : it->second.lost) {
        if (from >= it->second.synced_size) continue;
        std::fstream f(it->first, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(static_cast<std::streamoff>(from));
        const std::string zeros(std::min(to, it->second.synced_size) - from, '\0');
        f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
      }
      it->second.lost.clear();
      ++it;
    }
  }

 private:
  struct State {
    uint64_t synced_size = 0;
    bool durable_name = true;
    // Ranges whose sync failed: Linux marks such pages clean and may drop them, so a later sync
    // "succeeds" without them (the fsyncgate behaviour). crash() zeroes them.
    std::vector<std::pair<uint64_t, uint64_t>> lost;
  };
  class File final : public WritableFile {
   public:
    File(FaultInjectionFS& fs, std::filesystem::path path, std::unique_ptr<WritableFile> real)
        : fs_(fs), path_(std::move(path)), real_(std::move(real)) {}
    Status append(std::span<const uint8_t> bytes) override {
      std::lock_guard lock(fs_.mu_);
      auto& left = fs_.faults.space_left;
      if (left >= 0 && static_cast<int64_t>(bytes.size()) > left) {
        // A short write, then ENOSPC: the bytes that fit reach the file.
        const size_t fit = static_cast<size_t>(left);
        left = 0;
        if (fit) (void)real_->append(bytes.first(fit));
        return errno_status("cannot write", path_, ENOSPC);
      }
      if (left >= 0) left -= static_cast<int64_t>(bytes.size());
      return real_->append(bytes);
    }
    Status truncate(uint64_t size) override {
      std::lock_guard lock(fs_.mu_);
      Status st = real_->truncate(size);
      if (st.ok()) {
        State& s = fs_.files_[key(path_)];
        s.synced_size = std::min(s.synced_size, size);
      }
      return st;
    }
    Status sync() override {
      std::lock_guard lock(fs_.mu_);
      if (fs_.faults.fail_sync_after >= 0 && fs_.syncs_++ >= fs_.faults.fail_sync_after) {
        State& s = fs_.files_[key(path_)];
        if (real_->size() > s.synced_size) s.lost.push_back({s.synced_size, real_->size()});
        s.synced_size = real_->size();
        return errno_status("cannot fdatasync", path_, EIO);
      }
      Status st = real_->sync();
      if (st.ok()) fs_.files_[key(path_)].synced_size = real_->size();
      return st;
    }
    uint64_t size() const override { return real_->size(); }

   private:
    FaultInjectionFS& fs_;
    std::filesystem::path path_;
    std::unique_ptr<WritableFile> real_;
  };

  static std::string key(const std::filesystem::path& p) { return std::filesystem::absolute(p).lexically_normal().string(); }

  State& state(const std::filesystem::path& path, bool existed, uint64_t size) {
    auto [it, inserted] = files_.try_emplace(key(path));
    if (inserted) {
      // A file we have not seen: what exists is durable (written before this FS took over).
      it->second.synced_size = existed ? size : 0;
      it->second.durable_name = existed;
    }
    return it->second;
  }

  // Remembers what the name `path` durably stood for (its synced content, or nothing) before its first
  // change since its directory was last synced; crash() puts that back.
  void note_replaced(const std::filesystem::path& path) {
    const std::string k = key(path);
    if (replaced_.count(k)) return;
    auto it = files_.find(k);
    const bool durable = std::filesystem::exists(path) && (it == files_.end() || it->second.durable_name);
    if (!durable) {
      replaced_[k] = std::nullopt;
      return;
    }
    std::ifstream in(path, std::ios::binary);
    std::string content(std::istreambuf_iterator<char>(in), {});
    if (it != files_.end()) content.resize(std::min<uint64_t>(content.size(), it->second.synced_size));
    replaced_[k] = content;
  }

  std::mutex mu_;  // the pool's writer thread and the test thread both use it
  std::map<std::string, State> files_;
  std::map<std::string, std::optional<std::string>> replaced_;  // path -> durable content before (none: absent)
  int syncs_ = 0, renames_ = 0, dir_syncs_ = 0;
};

}  // namespace towers::test
