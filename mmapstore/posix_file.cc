#include "mmapstore/posix_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace towers {

Status errno_status(const std::string& what, const std::filesystem::path& path, int err) {
  std::string m = what + " " + path.string() + ": " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) return Status::ResourceExhausted(std::move(m));
  return Status::IOError(std::move(m));
}

namespace {

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::filesystem::path path, int fd, uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
  ~PosixWritableFile() override { ::close(fd_); }

  Status append(std::span<const uint8_t> bytes) override {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t w = ::pwrite(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(size_ + done));
      if (w < 0) {
        if (errno == EINTR) continue;
        const int e = errno;
        size_ += done;  // what reached the file; the caller decides whether to cut it back
        return errno_status("cannot write", path_, e);
      }
      done += static_cast<size_t>(w);
    }
    size_ += done;
    return Status::Ok();
  }
  Status truncate(uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) return errno_status("cannot truncate", path_, errno);
    size_ = size;
    return Status::Ok();
  }
  Status sync() override {
    if (::fdatasync(fd_) != 0) return errno_status("cannot fdatasync", path_, errno);
    return Status::Ok();
  }
  uint64_t size() const override { return size_; }

 private:
  std::filesystem::path path_;
  int fd_;
  uint64_t size_;
};

class PosixFileSystem final : public FileSystem {
 public:
  Result<std::unique_ptr<WritableFile>> open_append(const std::filesystem::path& path) override {
    return open(path, O_WRONLY | O_CREAT | O_CLOEXEC);
  }
  Result<std::unique_ptr<WritableFile>> create(const std::filesystem::path& path) override {
    return open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC);
  }
  Status rename(const std::filesystem::path& from, const std::filesystem::path& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return errno_status("cannot rename " + from.string() + " to", to, errno);
    return Status::Ok();
  }
  Status remove(const std::filesystem::path& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return errno_status("cannot remove", path, errno);
    return Status::Ok();
  }
  Status sync_dir(const std::filesystem::path& dir) override {
    const auto d = dir.empty() ? std::filesystem::path(".") : dir;
    int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno_status("cannot open directory", d, errno);
    const int rc = ::fsync(fd);
    const int e = errno;
    ::close(fd);
    if (rc != 0) return errno_status("cannot fsync directory", d, e);
    return Status::Ok();
  }

 private:
  static Result<std::unique_ptr<WritableFile>> open(const std::filesystem::path& path, int flags) {
    int fd = ::open(path.c_str(), flags, 0600);
    if (fd < 0) return errno_status("cannot open", path, errno);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      return errno_status("cannot stat", path, e);
    }
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd, static_cast<uint64_t>(st.st_size)));
  }
};

}  // namespace

FileSystem& posix_fs() {
  static PosixFileSystem fs;
  return fs;
}

Status write_file_atomic(FileSystem& fs, const std::filesystem::path& path,
                         std::span<const std::span<const uint8_t>> parts) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  auto file = fs.create(tmp);
  if (!file.ok()) return file.status();
  Status st;
  for (auto part : parts) {
    if (st.ok()) st = file.value()->append(part);
  }
  if (st.ok()) st = file.value()->sync();
  file.value().reset();
  if (st.ok()) st = fs.rename(tmp, path);
  if (!st.ok()) {
    (void)fs.remove(tmp);
    return st;
  }
  return fs.sync_dir(path.parent_path());
}

}  // namespace towers
