// Status and Result<T>: errors as values with a message meant for a human (LevelDB style).
// Nothing in engine/ throws across its API for bad input; it returns one of these.
#pragma once
#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace towers {

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message), true); }
  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const std::string& message() const { return message_; }

 private:
  Status(std::string m, bool failed) : message_(std::move(m)), failed_(failed) {}
  std::string message_;
  bool failed_ = false;
};

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
