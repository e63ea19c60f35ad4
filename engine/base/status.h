// Status and Result<T>: errors as values with a code and a message meant for a human (LevelDB's
// include/leveldb/status.h is the model). Nothing in engine/ throws across its API for bad input; it
// returns one of these. Only the daemon's HTTP edge maps a code to a protocol status.
#pragma once
#include <cassert>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace towers {

class Status {
 public:
  enum class Code : uint8_t {
    kOk = 0,
    kError,              // unclassified (treated as an internal error at the edge)
    kNotFound,           // the named thing does not exist
    kInvalidArgument,    // the caller's input is wrong; retrying the same call fails again
    kConflict,           // the state does not allow it now (busy, has children, exists already)
    kCorruption,         // stored bytes fail a check
    kIOError,            // the file system failed
    kResourceExhausted,  // a limit or quota is reached (queue, sessions, context, disk)
    kUnavailable,        // temporarily unable (starting, stopping); retry later
    kCancelled,          // the caller went away
    kPermissionDenied,
    kUnimplemented,      // a request field or feature this server does not support
  };

  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(Code::kError, std::move(message)); }
  static Status NotFound(std::string message) { return Status(Code::kNotFound, std::move(message)); }
  static Status InvalidArgument(std::string message) { return Status(Code::kInvalidArgument, std::move(message)); }
  static Status Conflict(std::string message) { return Status(Code::kConflict, std::move(message)); }
  static Status Corruption(std::string message) { return Status(Code::kCorruption, std::move(message)); }
  static Status IOError(std::string message) { return Status(Code::kIOError, std::move(message)); }
  static Status ResourceExhausted(std::string message) { return Status(Code::kResourceExhausted, std::move(message)); }
  static Status Unavailable(std::string message) { return Status(Code::kUnavailable, std::move(message)); }
  static Status Cancelled(std::string message) { return Status(Code::kCancelled, std::move(message)); }
  static Status PermissionDenied(std::string message) { return Status(Code::kPermissionDenied, std::move(message)); }
  static Status Unimplemented(std::string message) { return Status(Code::kUnimplemented, std::move(message)); }
  static Status WithCode(Code code, std::string message) { return Status(code, std::move(message)); }

  bool ok() const { return code_ == Code::kOk; }
  explicit operator bool() const { return ok(); }
  Code code() const { return code_; }
  bool is_not_found() const { return code_ == Code::kNotFound; }
  bool is_invalid_argument() const { return code_ == Code::kInvalidArgument; }
  bool is_corruption() const { return code_ == Code::kCorruption; }
  bool is_io_error() const { return code_ == Code::kIOError; }
  const std::string& message() const { return message_; }
  // The same code with context in front: "segment \"x\": " + message.
  Status prefixed(std::string_view context) const {
    return ok() ? *this : Status(code_, std::string(context) + message_);
  }

 private:
  Status(Code c, std::string m) : message_(std::move(m)), code_(c) {}
  std::string message_;
  Code code_ = Code::kOk;
};

inline std::string_view code_name(Status::Code code) {
  switch (code) {
    case Status::Code::kOk: return "ok";
    case Status::Code::kError: return "error";
    case Status::Code::kNotFound: return "not_found";
    case Status::Code::kInvalidArgument: return "invalid_argument";
    case Status::Code::kConflict: return "conflict";
    case Status::Code::kCorruption: return "corruption";
    case Status::Code::kIOError: return "io_error";
    case Status::Code::kResourceExhausted: return "resource_exhausted";
    case Status::Code::kUnavailable: return "unavailable";
    case Status::Code::kCancelled: return "cancelled";
    case Status::Code::kPermissionDenied: return "permission_denied";
    case Status::Code::kUnimplemented: return "unimplemented";
  }
  return "?";
}

template <class T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}             // NOLINT: implicit on purpose
  Result(Status error) : v_(std::move(error)) {         // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result built from an ok Status");
  }
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }
  Status status() const { return ok() ? Status::Ok() : std::get<1>(v_); }
  const std::string& error() const { return std::get<1>(v_).message(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace towers
