// One thread for the rare blocking jobs a request starts that are not model steps (coding a segment
// for the cold tier right now): a handler posts the job here and returns, so no I/O thread waits.
// Jobs run one at a time, in order; the destructor runs what is queued, then joins.
#pragma once
#include <functional>
#include <memory>

namespace towers::daemon {

class Offload {
 public:
  Offload();
  ~Offload();
  Offload(const Offload&) = delete;
  Offload& operator=(const Offload&) = delete;
  void post(std::function<void()> job);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace towers::daemon
