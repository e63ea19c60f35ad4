// The scheduler's seam to the model: one step of several sequences (decodes and prompt or build
// chunks, engine/model/forward.h's Forward::Sequence) gives their logits, and says what it cost. The
// scheduler paces prefill and bounds background work by that cost (daemon/prefill_pacer.h).
// ForwardStep is the real one: the forward pass, timed by the wall clock. tests/test_scheduler.cc
// puts a fake behind it that needs no model file and reports its cost in counted units.
#pragma once
#include <chrono>
#include <span>
#include <vector>

#include "engine/model/forward.h"

namespace towers::daemon {

class ModelStep {
 public:
  virtual ~ModelStep() = default;
  // Appends every sequence's tokens to its cache; logits gets, sequence after sequence, the rows
  // each one asked for (n_vocab floats each). A sequence's logits must not depend on its batch.
  virtual Status eval_batch(std::span<const Forward::Sequence> batch, std::vector<float>& logits) = 0;
  // What the last eval_batch cost, in seconds.
  virtual double last_step_seconds() const = 0;
};

class ForwardStep final : public ModelStep {
 public:
  explicit ForwardStep(Forward& forward) : forward_(forward) {}
  Status eval_batch(std::span<const Forward::Sequence> batch, std::vector<float>& logits) override {
    const auto start = std::chrono::steady_clock::now();
    Status st = forward_.eval_batch(batch, logits);
    last_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return st;
  }
  double last_step_seconds() const override { return last_seconds_; }

 private:
  Forward& forward_;
  double last_seconds_ = 0;
};

}  // namespace towers::daemon
